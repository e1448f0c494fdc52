"""Spark throughput of the hamq data source, side by side with Parquet in the same run.

    HAMQ_NAMESRV=127.0.0.1:9876 .venv/bin/python bench/spark_bench.py [--count 1000000]

1. fills topic SparkBench (4 queues, 1 KiB messages, via ``hamq bench produce``) up to
   ``--count`` messages;
2. batch read on ``local[2]``: ``count()`` of the whole topic, then ``count(*)`` with
   ``sum(length(value))`` (which makes Parquet read the values too), each beside the same
   query over the same rows written to Parquet (the write is not timed);
3. streaming write: those Parquet rows through ``writeStream.format("hamq")`` (exactly-once
   sink) into topic SparkBenchOut with Trigger.AvailableNow.
Prints one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hamq.client.sync import Admin


def timed(label: str, run, rows: int, **extra) -> float:
    started = time.perf_counter()
    result = run()
    elapsed = time.perf_counter() - started
    print(
        json.dumps(
            {
                "bench": label,
                "rows": rows,
                "elapsed_s": round(elapsed, 3),
                "rows_per_s": round(rows / elapsed),
                "result": str(result),
                **extra,
            }
        ),
        flush=True,
    )
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namesrv", default=os.environ.get("HAMQ_NAMESRV", "127.0.0.1:9876"))
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--topic", default="SparkBench")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    with Admin(args.namesrv) as admin:
        admin.create_topic(args.topic, queue_nums=4)
        admin.create_topic(args.topic + "Out", queue_nums=4)
        held = sum(r["max_offset"] - r["min_offset"] for r in admin.topic_offsets(args.topic))
    if held < args.count:
        subprocess.run(
            [
                Path(sys.executable).with_name("hamq"),
                "bench",
                "produce",
                "--namesrv",
                args.namesrv,
                "--topic",
                args.topic,
                "--count",
                str(args.count - held),
                "--json",
            ],
            check=True,
        )

    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("hamq-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    hamq_df = (
        spark.read.format("hamq").option("namesrv", args.namesrv).option("topic", args.topic).load()
    )
    query = "count(*) as n", "sum(length(value)) as bytes"
    rows = hamq_df.count()
    work = Path(tempfile.mkdtemp(prefix="hamq-spark-bench-"))
    try:
        hamq_df.write.parquet(str(work / "rows"))
        parquet_df = spark.read.parquet(str(work / "rows"))
        for attempt in (1, 2):
            count_s = timed("batch_count_hamq", hamq_df.count, rows, attempt=attempt)
            parquet_count_s = timed("batch_count_parquet", parquet_df.count, rows, attempt=attempt)
            print(
                json.dumps(
                    {
                        "bench": "batch_count_ratio",
                        "attempt": attempt,
                        "hamq_over_parquet_rows_per_s": round(parquet_count_s / count_s, 3),
                    }
                ),
                flush=True,
            )
            hamq_s = timed(
                "batch_read_hamq",
                lambda: hamq_df.selectExpr(*query).collect(),
                rows,
                attempt=attempt,
            )
            parquet_s = timed(
                "batch_read_parquet",
                lambda: parquet_df.selectExpr(*query).collect(),
                rows,
                attempt=attempt,
            )
            print(
                json.dumps(
                    {
                        "bench": "batch_read_ratio",
                        "attempt": attempt,
                        "hamq_over_parquet_rows_per_s": round(parquet_s / hamq_s, 3),
                    }
                ),
                flush=True,
            )

        def stream_write() -> int:
            q = (
                spark.readStream.schema(parquet_df.schema)
                .parquet(str(work / "rows"))
                .selectExpr("value", "key")
                .writeStream.format("hamq")
                .option("namesrv", args.namesrv)
                .option("topic", args.topic + "Out")
                .option("checkpointLocation", str(work / "ckpt"))
                .trigger(availableNow=True)
                .start()
            )
            q.awaitTermination()
            return sum(p["numInputRows"] for p in q.recentProgress)

        timed("stream_write_hamq", stream_write, rows)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
