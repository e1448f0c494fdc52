"""The controller peer's IO shell around ``hamq.controller.core``: the Raft driver, the
request processor, role-change notifications, election accounting, and the service that
runs standalone (``hamq controller``) or inside a name server."""
