"""A streaming query run as its own driver process, so tests can kill -9 it mid-stream and
start it again from its checkpoint. Argument: one JSON object (see ``main``)."""

from __future__ import annotations

import json
import os
import sys


def main(spec: dict) -> None:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("hamq-stream-job")
    for key, value in spec["conf"].items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    source = (
        spark.readStream.format("hamq")
        .option("namesrv", spec["namesrv"])
        .option("topic", spec["source"])
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", spec["max_per_trigger"])
    )
    if spec.get("group"):
        source = source.option("group", spec["group"])
    df = source.load()
    if spec["sink"] == "parquet":
        writer = (
            df.selectExpr("cast(value as string) as value", "queue", "offset")
            .writeStream.format("parquet")
            .option("path", spec["output"])
        )
    else:
        writer = (
            df.selectExpr("value", "key")
            .writeStream.format("hamq")
            .option("namesrv", spec["namesrv"])
            .option("topic", spec["output"])
        )
    writer = writer.option("checkpointLocation", spec["checkpoint"])
    if spec["trigger"] == "available_now":
        writer.trigger(availableNow=True).start().awaitTermination()
    else:
        writer.trigger(processingTime="200 milliseconds").start().awaitTermination()


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main(json.loads(sys.argv[1]))
