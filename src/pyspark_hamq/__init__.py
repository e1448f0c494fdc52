"""Spark registers every importable ``pyspark_*`` module's ``DefaultSource`` on its first
Python data source lookup, so ``format("hamq")`` works without ``hamq.spark.register``."""

from hamq.spark.source import HamqDataSource as DefaultSource

__all__ = ["DefaultSource"]
