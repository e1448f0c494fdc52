"""Pop consumption (RocketMQ 5): the service, its per-queue state and the revive log."""
