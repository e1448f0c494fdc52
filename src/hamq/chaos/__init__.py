"""The chaos suite: real clusters on test hosts (network namespaces), faults injected by
nemeses, clients recording histories, and a checker that turns histories into a verdict
(lost, duplicated, reordered, phantom, divergent, unavailability) per mode and fault, which
``hamq chaos matrix`` publishes as docs/RELIABILITY.md."""
