"""The example pipeline (examples/pipeline/run.py) end to end, checked from outside: the
Parquet output is read with pyarrow and compared with the orders recomputed from the
producer's seed, and the order-aggregates messages run.py read back are compared with
the Parquet rows."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pq_dataset = pytest.importorskip("pyarrow.dataset")

PIPELINE = Path(__file__).resolve().parents[2] / "examples" / "pipeline"
COUNT, SEED, MINUTES = 3000, 11, 4
RUN_TIMEOUT_S = 420.0  # a cold Spark session plus a few micro-batches on a busy machine


def _load_producer():
    spec = importlib.util.spec_from_file_location("produce_orders", PIPELINE / "produce_orders.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _stop_leftovers(work: Path) -> None:
    """Whatever run.py did not stop (it was killed): hamq dev and its children, by PID."""
    try:
        pids = json.loads((work / "cluster" / "cluster.json").read_text())["pids"]
    except (OSError, ValueError, KeyError):
        return
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # gone
        if b"hamq" in cmdline:  # not a PID the system has reused since
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_pipeline_example(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(PIPELINE / "run.py"),
            "--count",
            str(COUNT),
            "--seed",
            str(SEED),
            "--minutes",
            str(MINUTES),
            "--max-records-per-trigger",
            "1000",
            "--work-dir",
            str(tmp_path),
            "--report",
            str(report_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        try:
            output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # run.py stops its cluster on SIGTERM
            try:
                output, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                output, _ = proc.communicate()
            pytest.fail(f"run.py took over {RUN_TIMEOUT_S} s:\n{output[-4000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _stop_leftovers(tmp_path)
    assert proc.returncode == 0, output[-6000:]

    # Expected: recomputed from the producer's deterministic generator.
    producer = _load_producer()
    expected = producer.summarize(producer.generate(COUNT, SEED, MINUTES))
    assert expected.orders == COUNT

    # The Parquet output, read without Spark ("_spark_metadata" is skipped as a "_" path).
    rows = pq_dataset.dataset(tmp_path / "out" / "parquet", format="parquet").to_table().to_pylist()
    per_customer: dict[str, list] = defaultdict(lambda: [0, Decimal(0)])
    for row in rows:
        assert row["window_end"] - row["window_start"] == timedelta(minutes=1)
        per_customer[row["customer"]][0] += row["orders"]
        per_customer[row["customer"]][1] += row["amount"]
    assert {c: tuple(v) for c, v in per_customer.items()} == expected.per_customer
    keys = [(r["window_start"], r["customer"]) for r in rows]
    assert len(keys) == len(set(keys)), "a (window, customer) was emitted twice"
    windows = {r["window_start"] for r in rows}
    assert len(windows) == MINUTES  # every window, including the last ones, was emitted

    # The order-aggregates topic: one JSON message per Parquet row, keyed by customer.
    report = json.loads(report_path.read_text())
    assert report["ok"] and report["parquet_rows"] == len(rows)
    published = []
    for message in report["topic_messages"]:
        value = json.loads(message["value"], parse_float=Decimal)
        assert message["key"] == value["customer"]
        assert message["tags"] == "order-aggregate"
        published.append(
            (
                _utc_naive(value["window_start"]),
                value["customer"],
                value["orders"],
                Decimal(value["amount"]),
            )
        )
    from_parquet = [(r["window_start"], r["customer"], r["orders"], r["amount"]) for r in rows]
    assert sorted(published) == sorted(from_parquet)


def _utc_naive(text: str) -> datetime:
    """Spark's JSON timestamps are UTC with a Z; pyarrow gives Parquet's as naive UTC."""
    return datetime.fromisoformat(text).astimezone(UTC).replace(tzinfo=None)
