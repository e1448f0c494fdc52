"""The Structured Streaming job: orders per one-minute event-time window and customer.

Two streaming queries, each with its own checkpoint, both run with Trigger.AvailableNow so
the job ends once it has caught up:

1. ``aggregate``: readStream ``format("hamq")`` from ``orders`` → parse the JSON →
   watermark → group by (1-minute window, customer): count and sum of amount → Parquet,
   in **append** mode. Append + watermark emits each window once, final, when the
   watermark passes its end; Spark's file sink commits files through its
   ``_spark_metadata`` log, so the Parquet output is exactly once across restarts.
2. ``publish``: readStream Parquet (the committed files of query 1) → JSON → writeStream
   ``format("hamq")`` to ``order-aggregates`` (key = customer), exactly once through the
   hamq sink's journal. Chaining through Parquet rather than aggregating twice makes the
   topic hold exactly the rows the Parquet holds.

Why not update/complete mode with foreachBatch: it would emit a window several times as
it grows, so the Parquet output would need de-duplication by its readers, and
foreachBatch's batch write to hamq is not exactly once on replay. The catch of append
mode is that a window is emitted only once the watermark passes it, and the watermark
only moves with event time: on a bounded stream the last windows would never close.
The producer therefore ends the stream with an end-of-stream marker whose event time is
an hour past the last order; it moves the watermark beyond every real window, and Spark
runs one more (no-data) micro-batch to emit them before AvailableNow stops. The marker's
own window never closes, and it has no order_id, so ``orders > 0`` keeps it out anyway.

    python examples/pipeline/aggregate_job.py --namesrv 127.0.0.1:9876 --out /tmp/agg
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import DecimalType, StringType, StructField, StructType

SOURCE_TOPIC = "orders"
SINK_TOPIC = "order-aggregates"
# Above the producer's lateness (20 s), below its end-of-stream horizon (1 h).
WATERMARK_DELAY = "2 minutes"
WINDOW = "1 minute"

ORDER_SCHEMA = StructType(
    [
        StructField("order_id", StringType()),
        StructField("customer", StringType()),
        StructField("amount", DecimalType(12, 2)),  # exact: sums must match to the cent
        StructField("event_time", StringType()),
    ]
)


def spark_session(app: str = "hamq-pipeline") -> SparkSession:
    """A local session set up as this machine needs (see the README's Spark notes)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need pyarrow + hamq
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        # a stateful aggregation keeps one state store per shuffle partition: the
        # default 200 would make every micro-batch slow for a few thousand rows
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def aggregates(orders: DataFrame) -> DataFrame:
    """hamq rows → (window_start, window_end, customer, orders, amount)."""
    parsed = orders.select(
        F.from_json(F.col("value").cast("string"), ORDER_SCHEMA).alias("o")
    ).select("o.*")
    return (
        parsed.withColumn("event_time", F.to_timestamp("event_time"))
        .withWatermark("event_time", WATERMARK_DELAY)
        .groupBy(F.window("event_time", WINDOW), "customer")
        .agg(F.count("order_id").alias("orders"), F.sum("amount").alias("amount"))
        .where(F.col("orders") > 0)  # the end-of-stream marker's group has no order
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "customer",
            "orders",
            "amount",
        )
    )


def run(
    spark: SparkSession, namesrv: str, out_dir: Path, max_records_per_trigger: int = 5000
) -> None:
    """Run both queries to completion. ``out_dir`` holds ``parquet/`` and the two
    checkpoints; a second run on the same ``out_dir`` resumes where the first ended."""
    orders = (
        spark.readStream.format("hamq")
        .option("namesrv", namesrv)
        .option("topic", SOURCE_TOPIC)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", str(max_records_per_trigger))
        .load()
    )
    result = aggregates(orders)
    aggregate = (
        result.writeStream.queryName("aggregate")
        .format("parquet")
        .outputMode("append")
        .option("path", str(out_dir / "parquet"))
        .option("checkpointLocation", str(out_dir / "checkpoints" / "aggregate"))
        .trigger(availableNow=True)
        .start()
    )
    wait_and_report(aggregate)

    # The file source reads only files the Parquet sink committed (its _spark_metadata log).
    committed = spark.readStream.schema(result.schema).parquet(str(out_dir / "parquet"))
    as_json = F.to_json(F.struct("window_start", "window_end", "customer", "orders", "amount"))
    publish = (
        committed.select(
            F.col("customer").alias("key"),
            as_json.alias("value"),
            F.lit("order-aggregate").alias("tags"),
        )
        .writeStream.queryName("publish")
        .format("hamq")
        .option("namesrv", namesrv)
        .option("topic", SINK_TOPIC)
        .option("checkpointLocation", str(out_dir / "checkpoints" / "publish"))
        .trigger(availableNow=True)
        .start()
    )
    wait_and_report(publish)


def wait_and_report(query: StreamingQuery) -> None:
    """Wait for an AvailableNow query to end and say what it did (the last micro-batch of
    ``aggregate`` reads nothing: it is the one that emits the windows the watermark closed)."""
    query.awaitTermination()
    progress = query.recentProgress
    print(
        f"query {query.name}: {len(progress)} micro-batch(es), "
        f"{sum(p['numInputRows'] for p in progress)} input rows, rows per batch "
        f"{[p['numInputRows'] for p in progress]}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namesrv", default="127.0.0.1:9876")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-records-per-trigger", type=int, default=5000)
    args = parser.parse_args()
    spark = spark_session()
    try:
        run(spark, args.namesrv, args.out, args.max_records_per_trigger)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
