"""The name server: route registry, broker heartbeats, member groups."""
