"""hamq reads on ``local[2]`` beside a no-I/O Python data source yielding the same Arrow
batches, in the same run, per column set (issue 19 item 12); and the connections a
streaming read opens per 200 ms trigger over 16 queues (item 13).

    HAMQ_NAMESRV=127.0.0.1:9876 .venv/bin/python bench/spark_columns_bench.py reads
    .venv/bin/python bench/spark_columns_bench.py triggers --broker 127.0.0.1:10911

``reads`` expects topic SparkBench filled by ``bench/spark_bench.py`` (1M x 1 KiB, 4
queues). The no-I/O source decodes one real pull of queue 0 once per partition and yields
that batch until it has produced as many rows as hamq's partition of the same queue
(``replay``: Spark's own cost of taking the batches); with ``decode=each`` it decodes the
pull again for every batch (``decode``: the same work as hamq's reader but the pulls).
``triggers`` runs with the tree on PYTHONPATH it is given (before/after: the old tree's
``src``). ``codec`` times decoding alone over real pulls; ``pull`` reads the topic as two
Spark tasks would, without Spark, and tells the broker's share. Prints one JSON line per
measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from hamq import Message
from hamq.client.message import MessageQueue
from hamq.client.sync import Admin, Producer, PullConsumer

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from tcp_sockets import client_ports

SCHEMAS = {
    "all": None,  # the source's own schema: every column
    "value": "value binary",
    "none": StructType(),  # row counts only
}


class _Replay(InputPartition):
    def __init__(self, records: bytes, rows: int) -> None:
        self.records, self.rows = records, rows


class _ReplayReader(DataSourceReader):
    def __init__(self, options: dict, columns: tuple[str, ...]) -> None:
        self.options, self.columns = options, columns

    def partitions(self) -> list[_Replay]:
        with Admin(self.options["namesrv"]) as admin:
            rows = admin.topic_offsets(self.options["topic"])
        with PullConsumer("bench-replay", self.options["namesrv"]) as consumer:
            pulled = consumer.pull_raw(MessageQueue(self.options["topic"], "broker-a", 0), 0, 8192)
        return [_Replay(bytes(pulled.records), r["max_offset"] - r["min_offset"]) for r in rows]

    def read(self, partition: _Replay):  # type: ignore[override]
        from hamq.spark.arrow_codec import records_to_batch
        from hamq.spark.schema import arrow_schema

        schema = arrow_schema(self.columns)
        each = self.options.get("decode") == "each"
        batch = None
        left = partition.rows
        while left > 0:
            if batch is None or each:
                batch, _ = records_to_batch(
                    partition.records, 0, 1 << 62, "SparkBench", "broker-a", 0, schema
                )
            yield batch if left >= batch.num_rows else batch.slice(0, left)
            left -= batch.num_rows


class ReplaySource(DataSource):
    """The same Arrow batches as hamq's reader yields, without any I/O."""

    @classmethod
    def name(cls) -> str:
        return "hamqreplay"

    def schema(self):
        from hamq.spark.schema import SPARK_SCHEMA

        return SPARK_SCHEMA

    def reader(self, schema):
        from hamq.spark.schema import read_columns

        return _ReplayReader(dict(self.options), read_columns(schema))


# (label, format, decode option): hamq's reader and the no-I/O source both ways
SOURCES = (("hamq", "hamq", ""), ("replay", "hamqreplay", "once"), ("decode", "hamqreplay", "each"))


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("hamq-columns-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def reads(args) -> None:
    spark = session()
    spark.dataSource.register(ReplaySource)
    queries = ("count", "sum_length_value")
    for attempt in range(1, args.attempts + 1):
        for label, schema in SCHEMAS.items():
            frames = {}
            for source, fmt, decode in SOURCES:
                r = spark.read.format(fmt)
                if schema is not None:
                    r = r.schema(schema)
                r = r.option("namesrv", args.namesrv).option("topic", args.topic)
                frames[source] = (r.option("decode", decode) if decode else r).load()
            for query in queries:
                if query == "sum_length_value" and label == "none":
                    continue
                elapsed = {}
                for source, df in frames.items():
                    started = time.perf_counter()
                    if query == "count":
                        rows = df.count()
                    else:
                        rows = df.selectExpr("count(*)", "sum(length(value))").collect()[0][0]
                    elapsed[source] = time.perf_counter() - started
                    emit(
                        bench=f"read_{query}",
                        columns=label,
                        source=source,
                        attempt=attempt,
                        rows=rows,
                        elapsed_s=round(elapsed[source], 3),
                        rows_per_s=round(rows / elapsed[source]),
                        load=os.getloadavg()[0],
                    )
                emit(
                    bench=f"read_{query}_ratio",
                    columns=label,
                    attempt=attempt,
                    hamq_over_replay=round(elapsed["replay"] / elapsed["hamq"], 3),
                    hamq_over_decode=round(elapsed["decode"] / elapsed["hamq"], 3),
                )
    spark.stop()


def triggers(args) -> None:
    """A stream over 16 queues with 200 ms triggers into the noop sink while a producer
    keeps every queue fed: connections opened per trigger and trigger durations."""
    topic = "SparkTriggers"
    with Admin(args.namesrv) as admin:
        admin.create_topic(topic, queue_nums=16)
    stop = threading.Event()

    def produce() -> None:
        with Producer(args.namesrv, "bench-triggers") as producer:
            while not stop.is_set():
                for q in range(16):
                    producer.send_batch(
                        [Message(topic, b"x" * 1024)] * 50, MessageQueue(topic, "broker-a", q)
                    )
                time.sleep(0.05)

    feeder = threading.Thread(target=produce, daemon=True)
    feeder.start()
    spark = session()
    ports = int(args.broker.rsplit(":", 1)[1]), int(args.namesrv.rsplit(":", 1)[1])
    with tempfile.TemporaryDirectory() as ckpt:
        query = (
            spark.readStream.format("hamq")
            .option("namesrv", args.namesrv)
            .option("topic", topic)
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", ckpt)
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        time.sleep(args.warmup_s)  # the first triggers start the Python workers
        before = [client_ports(p) for p in ports]
        seen = len(query.recentProgress)
        time.sleep(args.seconds)
        progress = query.recentProgress[seen:]
        opened = [len(client_ports(p) - b) for p, b in zip(ports, before, strict=True)]
        query.stop()
    stop.set()
    spark.stop()
    durations = [p["durationMs"]["triggerExecution"] for p in progress]
    emit(
        bench="stream_triggers_16_queues",
        triggers=len(progress),
        rows=sum(p["numInputRows"] for p in progress),
        broker_connections_per_trigger=round(opened[0] / max(len(progress), 1), 2),
        namesrv_connections_per_trigger=round(opened[1] / max(len(progress), 1), 2),
        trigger_ms_median=statistics.median(durations),
        trigger_ms_p90=sorted(durations)[int(len(durations) * 0.9)],
        load=os.getloadavg()[0],
    )


COLUMN_SETS = {
    "all": None,
    "value": ("value",),
    "value+offset+timestamp": ("value", "offset", "timestamp"),
    "none": (),
}


def codec(args) -> None:
    """Decoding alone: ``records_to_batch`` over ten real pulls of queue 0, best of five, per
    column set (no Spark, no I/O)."""
    from hamq.spark.arrow_codec import records_to_batch
    from hamq.spark.schema import READ_COLUMNS, arrow_schema

    pulls = []
    with PullConsumer("bench-codec", args.namesrv) as consumer:
        offset = 0
        for _ in range(10):
            pulled = consumer.pull_raw(MessageQueue(args.topic, "broker-a", 0), offset, 8192)
            pulls.append((offset, bytes(pulled.records)))
            offset = pulled.next_begin_offset
    for label, columns in COLUMN_SETS.items():
        schema = arrow_schema(READ_COLUMNS if columns is None else columns)
        best, rows = float("inf"), 0
        for _ in range(5):
            started, rows = time.perf_counter(), 0
            for start, data in pulls:
                batch, _ = records_to_batch(data, start, 1 << 62, args.topic, "broker-a", 0, schema)
                rows += batch.num_rows
            best = min(best, time.perf_counter() - started)
        emit(
            bench="decode", columns=label, messages=rows, us_per_message=round(best / rows * 1e6, 3)
        )


def _pull_queues(namesrv: str, topic: str, queues: list[int], columns, end: int) -> dict:
    from hamq.spark.offsets import QueueRange
    from hamq.spark.options import ReadOptions
    from hamq.spark.pull import read_range
    from hamq.spark.schema import READ_COLUMNS

    options = ReadOptions.parse({"namesrv": namesrv, "topic": topic})
    started, cpu, rows = time.perf_counter(), time.process_time(), 0
    for q in queues:
        for batch in read_range(
            options,
            QueueRange(topic, "broker-a", q, 0, end),
            READ_COLUMNS if columns is None else columns,
        ):
            rows += batch.num_rows
    return {
        "rows": rows,
        "wall_s": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu,
    }


def pull(args) -> None:
    """hamq's executor read path without Spark: two processes (as ``local[2]``'s two
    tasks) each reading two of the four queues with ``read_range``; their wall and CPU time,
    and the broker's CPU time over the run (``--broker-pid``)."""
    from concurrent.futures import ProcessPoolExecutor

    def broker_cpu_s() -> float:
        if args.broker_pid is None:
            return float("nan")
        fields = Path(f"/proc/{args.broker_pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    with Admin(args.namesrv) as admin:
        end = min(r["max_offset"] for r in admin.topic_offsets(args.topic))
    with ProcessPoolExecutor(2) as pool:
        for label, columns in COLUMN_SETS.items():
            before = broker_cpu_s()
            runs = [
                pool.submit(_pull_queues, args.namesrv, args.topic, queues, columns, end)
                for queues in ([0, 1], [2, 3])
            ]
            done = [r.result() for r in runs]
            emit(
                bench="pull_two_readers",
                columns=label,
                rows=sum(d["rows"] for d in done),
                wall_s=round(max(d["wall_s"] for d in done), 3),
                reader_cpu_s=[round(d["cpu_s"], 3) for d in done],
                broker_cpu_s=round(broker_cpu_s() - before, 2),
                load=os.getloadavg()[0],
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("reads", "triggers", "codec", "pull"))
    parser.add_argument("--namesrv", default=os.environ.get("HAMQ_NAMESRV", "127.0.0.1:9876"))
    parser.add_argument("--topic", default="SparkBench")
    parser.add_argument("--broker", help="triggers: the broker's address (host:port)")
    parser.add_argument("--broker-pid", type=int, help="pull: the broker's pid (its CPU time)")
    parser.add_argument("--attempts", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup-s", type=float, default=15.0)
    args = parser.parse_args()
    {"reads": reads, "triggers": triggers, "codec": codec, "pull": pull}[args.stage](args)


if __name__ == "__main__":
    main()
