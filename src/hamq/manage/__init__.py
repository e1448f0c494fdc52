"""What the CLI and the web API ask of a cluster and do to it, in one place: both read
queues, mirrors and policies through these functions with the same admin clients, so an
operator sees the same facts in ``hamq admin`` and on ``/api``."""
