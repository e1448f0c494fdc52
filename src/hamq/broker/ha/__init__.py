"""Master–slave HA of one group (seed 000): log transfer, slave metadata sync, member group."""
