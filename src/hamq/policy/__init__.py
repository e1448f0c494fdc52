"""Mirrored-queue policies (RabbitMQ's ha-* rules) and the sans-IO reconciler that turns
them, the declared topics and the live nodes into broker groups and the steps to reach them."""
