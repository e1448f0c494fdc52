"""The ``hamq`` command line."""
