"""Run the example pipeline end to end (``make pipeline``): a throwaway ``hamq dev``
cluster, the order producer, the Spark job, then a read-back of what the job wrote.

It starts ``hamq dev`` in a temporary data directory on free ports, creates ``orders`` and
``order-aggregates``, produces the orders, runs ``aggregate_job``, reads the Parquet
output and the ``order-aggregates`` topic back (``spark.read.format("hamq")``), prints
them with per-customer totals checked against what the producer sent, and stops the
cluster by its PIDs. Exit status 1 when the output does not match the input.

    python examples/pipeline/run.py [--count 20000] [--work-dir DIR] [--report FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from types import TracebackType

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DecimalType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from hamq.cli.dev_web import WEB_PORT_OFFSET
from hamq.client.sync import Admin

sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, however run.py runs
import aggregate_job
import produce_orders

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
# The message a consumer of order-aggregates receives: to_json of a Parquet row.
AGGREGATE_JSON = StructType(
    [
        StructField("window_start", TimestampType()),
        StructField("window_end", TimestampType()),
        StructField("customer", StringType()),
        StructField("orders", LongType()),
        StructField("amount", DecimalType(22, 2)),
    ]
)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port_base() -> int:
    """A name server port whose web console and broker ports (``hamq dev --mode single``:
    base+1000, base+1035, HA base+1036) are free as well."""
    for _ in range(200):
        base = random.randint(20_000, 50_000)
        if all(_port_free(p) for p in (base, base + WEB_PORT_OFFSET, base + 1035, base + 1036)):
            return base
    raise RuntimeError("no free port base found for hamq dev")


class DevCluster:
    """``hamq dev`` as a child process. Stopped by PID only: SIGTERM to ``hamq dev``
    (which stops its name server and broker), then SIGKILL to whichever of the PIDs it
    reported is still alive. The PIDs are also written to ``cluster.json`` so a caller
    (the test) can clean up even if this process is killed."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.proc: subprocess.Popen | None = None
        self.ready: dict = {}

    @property
    def namesrv(self) -> str:
        return self.ready["namesrv"]

    @property
    def pids(self) -> list[int | None]:
        """hamq dev's own PID first, then its children's (None until it is ready)."""
        return (
            [
                self.proc.pid,
                self.ready.get("namesrv_pid"),
                *(b["pid"] for b in self.ready.get("brokers", [])),
            ]
            if self.proc
            else []
        )

    def start(self) -> DevCluster:
        self.data.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # a port taken between our check and the bind: try elsewhere
            if self._try_start(free_port_base()):
                return self
        raise RuntimeError(f"hamq dev did not start; see the logs in {self.data}")

    def _try_start(self, port_base: int) -> bool:
        log = open(self.data / "dev.log", "ab")  # noqa: SIM115 (the child holds it)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hamq.cli.main",
                "dev",
                "--mode",
                "single",
                "--data",
                str(self.data),
                "--port-base",
                str(port_base),
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
        )  # Ctrl-C is ours
        log.close()
        (self.data / "cluster.json").write_text(json.dumps({"pids": [self.proc.pid]}))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            readable, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if readable:
                line = self.proc.stdout.readline()
                if not line:
                    break
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("event") == "ready":
                    self.ready = event
                    (self.data / "cluster.json").write_text(json.dumps({"pids": self.pids}))
                    return True
            elif self.proc.poll() is not None:
                break
        self.stop()
        return False

    def stop(self) -> None:
        if self.proc is None:
            return
        pids = self.pids
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        for pid in pids[1:]:
            kill_if_hamq(pid)
        self.proc, self.ready = None, {}

    def __enter__(self) -> DevCluster:
        return self.start()

    def __exit__(
        self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def kill_if_hamq(pid: int | None) -> None:
    """SIGKILL ``pid`` if it is still a hamq process (checked, so that a PID the system
    reused for something else is left alone)."""
    if pid is None:
        return
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return  # gone
    if b"hamq" in cmdline:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def create_topics(namesrv: str) -> None:
    with Admin(namesrv) as admin:
        for topic in (aggregate_job.SOURCE_TOPIC, aggregate_job.SINK_TOPIC):
            admin.create_topic(topic, queue_nums=4)


def read_back(
    spark: SparkSession, namesrv: str, out_dir: Path, sent: produce_orders.Summary
) -> dict:
    """Print what the job wrote and check it against what was sent; returns a report."""
    parquet = spark.read.parquet(str(out_dir / "parquet"))
    messages = (
        spark.read.format("hamq")
        .option("namesrv", namesrv)
        .option("topic", aggregate_job.SINK_TOPIC)
        .load()
        .select(
            F.col("key").cast("string").alias("key"),
            "tags",
            F.col("value").cast("string").alias("value"),
        )
    ).cache()
    published = messages.select(F.from_json("value", AGGREGATE_JSON).alias("a")).select("a.*")

    n_rows, n_messages = parquet.count(), messages.count()
    windows = parquet.select("window_start").distinct().count()
    print(
        f"\nParquet {out_dir / 'parquet'}: {n_rows} rows "
        f"({windows} one-minute windows x customers); a few:"
    )
    parquet.orderBy("window_start", "customer").show(5, truncate=False)
    print(f"topic {aggregate_job.SINK_TOPIC}: {n_messages} messages; a few:")
    messages.orderBy("value").show(3, truncate=False)

    totals = {
        r.customer: (r.orders, r.amount)
        for r in parquet.groupBy("customer")
        .agg(F.sum("orders").alias("orders"), F.sum("amount").alias("amount"))
        .collect()
    }
    print(f"{'customer':<14}{'sent':>8}{'in parquet':>12}{'amount sent':>16}{'in parquet':>16}")
    for customer, (n, amount) in sorted(sent.per_customer.items()):
        got_n, got_amount = totals.get(customer, (0, Decimal(0)))
        flag = "" if (got_n, got_amount) == (n, amount) else "   MISMATCH"
        print(f"{customer:<14}{n:>8}{got_n:>12}{amount:>16}{got_amount:>16}{flag}")
    got_orders = sum(n for n, _ in totals.values())
    got_amount = sum((a for _, a in totals.values()), Decimal(0))
    print(f"{'total':<14}{sent.orders:>8}{got_orders:>12}{sent.amount:>16}{got_amount:>16}")

    # The topic must hold each Parquet row exactly once, keyed by customer.
    missing = parquet.exceptAll(published).count()
    extra = published.exceptAll(parquet).count()
    bad_keys = messages.where(F.col("key") != F.get_json_object("value", "$.customer")).count()
    print(
        f"topic vs Parquet: {missing} rows missing, {extra} extra, {bad_keys} with a key "
        "other than the customer"
    )
    ok = totals == sent.per_customer and missing == extra == bad_keys == 0 and n_messages == n_rows
    print("OK: the output matches the orders sent" if ok else "FAILED: output differs")
    return {
        "ok": ok,
        "produced": sent.to_dict(),
        "parquet_rows": n_rows,
        "topic_messages": [r.asDict() for r in messages.collect()],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20_000, help="orders to produce")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--minutes", type=int, default=5, help="event-time span of orders")
    parser.add_argument("--max-records-per-trigger", type=int, default=5000)
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="keep cluster data and output here (default: a temporary "
        "directory, removed at the end)",
    )
    parser.add_argument("--report", type=Path, help="also write the read-back as JSON here")
    args = parser.parse_args()
    # SIGTERM (a test's timeout) unwinds like Ctrl-C, so the cluster is stopped below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="hamq-pipeline-"))
    started = time.monotonic()
    try:
        with DevCluster(work / "cluster") as cluster:
            kept = "" if args.work_dir else " (removed at the end; --work-dir keeps it)"
            print(f"hamq dev on {cluster.namesrv} (pids {cluster.pids}), data in {work}{kept}")
            create_topics(cluster.namesrv)
            sent = produce_orders.produce(cluster.namesrv, args.count, args.seed, args.minutes)
            print(
                f"produced {sent.orders} orders (amount {sent.amount}) of "
                f"{len(sent.per_customer)} customers to '{produce_orders.TOPIC}', then the "
                f"end-of-stream marker"
            )
            spark = aggregate_job.spark_session()
            try:
                job_started = time.monotonic()
                aggregate_job.run(
                    spark, cluster.namesrv, work / "out", args.max_records_per_trigger
                )
                print(f"Spark job done in {time.monotonic() - job_started:.1f} s")
                report = read_back(spark, cluster.namesrv, work / "out", sent)
            finally:
                spark.stop()
        print(f"stopped hamq dev; pipeline took {time.monotonic() - started:.1f} s")
        if args.report:
            args.report.write_text(json.dumps(report, default=str, indent=1))
        return 0 if report["ok"] else 1
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
