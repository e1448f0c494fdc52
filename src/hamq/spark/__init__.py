"""hamq as a Spark data source: ``spark.read.format("hamq")``, ``readStream``, ``write`` and
``writeStream``. Installed with ``pip install hamq[spark]``; ``register(spark)`` makes the
format known to a session (``pyspark_hamq`` also registers it automatically)."""

from __future__ import annotations

from pyspark.sql import SparkSession

from hamq.spark.source import HamqDataSource


def register(spark: SparkSession) -> None:
    spark.dataSource.register(HamqDataSource)


__all__ = ["HamqDataSource", "register"]
