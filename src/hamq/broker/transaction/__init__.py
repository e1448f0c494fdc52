"""Transaction messages: half messages, op records and the check-back service."""
