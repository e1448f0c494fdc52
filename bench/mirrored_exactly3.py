#!/usr/bin/env python3
"""Publish throughput to a mirrored topic, ha-mode exactly 3 (issue 16, seed 003), to set
beside ../shared/peers' RabbitMQ "mirrored" setup (classic queue, exactly 3, automatic sync).

    .venv/bin/python bench/mirrored_exactly3.py [--runs 3] [--count 50000] [--batched-count 500000]

Per run, a fresh `hamq dev --mode cluster --nodes 3` (name servers embedding the controller,
nodes hamq@node1..3), then what an operator does:
  hamq admin set-policy bench-ha '^bench\\.mirrored$' \\
      '{"ha-mode":"exactly","ha-params":3,"ha-sync-mode":"automatic"}'
  hamq admin declare-topic bench.mirrored --queues 4      (through node1: its home)
waits (bounded) until `list-queues` shows a master and 2 synchronised mirrors, warms up with
2000 messages, and measures
  single:  hamq bench produce --batch 1  --inflight 1000 --count <count>   (as the peers)
  batched: hamq bench produce --batch 64 --inflight 16   --count <batched-count>
Every answer waits for all synchronised mirrors (all_ack_in_sync_state_set); flush is async.
Processes run a snapshot of src/hamq and the cluster is stopped by its `hamq dev` PID (both
from compare_peers). Prints one JSON
object: per setup the runs and median [min-max] msgs/s, load averages, server CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_peers as cp  # (the bench directory is not a package)

SETUP = "mirrored-exactly3"
cp.SETUPS[SETUP] = ["--mode", "cluster", "--nodes", "3"]
TOPIC = "bench.mirrored"
POLICY = ["bench-ha", r"^bench\.mirrored$"]
DEFINITION = {"ha-mode": "exactly", "ha-params": 3, "ha-sync-mode": "automatic"}
MIRRORED_TIMEOUT_S = 120.0


def admin(cluster: cp.DevCluster, *args: str) -> object:
    controllers = ",".join(c["address"] for c in cluster.ready["controllers"])
    cmd = [cp.HAMQ, "admin", *args, "--controller", controllers, "--json"]
    done = subprocess.run(cmd, capture_output=True, timeout=60, cwd=cp.TMP_DIR)
    if done.returncode != 0:
        raise cp.BenchError(f"{' '.join(cmd)}: {done.stderr.decode(errors='replace')[-2000:]}")
    return json.loads(done.stdout)


def wait_mirrored(cluster: cp.DevCluster) -> dict:
    """The topic's row once its master has 2 synchronised mirrors."""
    columns = ["name", "pid", "slave_pids", "synchronised_slave_pids"]
    deadline = time.monotonic() + MIRRORED_TIMEOUT_S
    while time.monotonic() < deadline:
        rows = admin(cluster, "list-queues", *columns, "--namesrv", cluster.namesrv)
        row = next((r for r in rows if r["name"] == TOPIC), None)  # type: ignore[union-attr]
        if row and row["pid"] and len(row["synchronised_slave_pids"]) == 2:
            return row
        time.sleep(1)
    raise cp.BenchError(f"{TOPIC} not mirrored x3 after {MIRRORED_TIMEOUT_S} s")


def produce(batch: int, inflight: int, count: int) -> list[str]:
    return ["produce", "--topic", TOPIC, "--queues", "4", "--size", "1024",
            "--batch", str(batch), "--inflight", str(inflight), "--count", str(count)]  # fmt: skip


def one_run(a: argparse.Namespace, logdir: str, startup_cpu: float) -> dict:
    cluster = cp.DevCluster(SETUP, logdir)
    try:
        ready = cluster.start()
        cluster.server_pids += [c["pid"] for c in ready["controllers"][1:]]
        cluster.server_pids += [n["pid"] for n in ready["nodes"]]
        admin(cluster, "set-policy", *POLICY, json.dumps(DEFINITION))
        admin(cluster, "declare-topic", TOPIC, "--queues", "4")
        placement = wait_mirrored(cluster)
        cp.run_bench(cluster, produce(1, 100, 2000), 120, startup_cpu)  # warm-up
        out = {"placement": placement, "load_before": cp.loadavg()}
        out["single"] = cp.run_bench(cluster, produce(1, 1000, a.count), 300, startup_cpu)
        out["batched"] = cp.run_bench(cluster, produce(64, 16, a.batched_count), 300, startup_cpu)
        out["load_after"] = cp.loadavg()
        return out
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--count", type=int, default=50000)
    parser.add_argument("--batched-count", type=int, default=500000)
    a = parser.parse_args()
    logdir = tempfile.mkdtemp(prefix="hamq-mirrored-")
    # others edit the tree meanwhile: every process runs a snapshot of src/hamq (as compare_peers)
    snapshot = cp.snapshot_src(logdir)
    os.environ["PYTHONPATH"] = logdir
    startup_cpu = cp.measure_startup_cpu()
    runs = []
    for run in range(a.runs):
        runs.append(one_run(a, logdir, startup_cpu))
        cp.log(f"run {run + 1}: " + ", ".join(f"{s} {runs[-1][s]['msgs_per_s']:,} msgs/s"
                                             for s in ("single", "batched")))  # fmt: skip
    summary = {
        setup: {
            "msgs_per_s": cp.spread([r[setup]["msgs_per_s"] for r in runs]),
            "servers_cpu_pct": cp.spread([r[setup]["servers_cpu_pct"] for r in runs]),
            "errors": sum(r[setup]["errors"] for r in runs),
        }
        for setup in ("single", "batched")
    }
    result = {"summary": summary, "runs": runs, "git": cp.git_rev(), "src": snapshot}
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
