"""One local Spark session (``local[2]``) for all Spark tests, and one hamq cluster per
module: a cold session costs 10-15 s."""

from __future__ import annotations

import os

import pytest

from harness import Cluster
from spark_harness import SPARK_CONF, spark_env


@pytest.fixture(scope="session")
def spark():
    os.environ.update(spark_env())
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("hamq-tests")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def hamq_cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        c.start_namesrv()
        c.start_broker()
        yield c
    finally:
        c.stop_all()
