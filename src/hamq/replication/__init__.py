"""Sans-IO master–slave replication (seed 000): quorum arithmetic and HA progress."""
