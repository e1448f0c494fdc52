"""Commit log, consume queues, recovery, flush, retention and versioned metadata."""
