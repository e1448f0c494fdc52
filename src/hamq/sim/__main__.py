"""`python -m hamq.sim --seed N [--seeds COUNT] [--steps M] [--nodes K]`, or
`--mode master-slave` for the master–slave replication core, or `--mode controller` for
controller mode (controller peers, a group of three members and clients), or `--mode policy`
for mirrored-queue policies (the placement reconciler and driver over nodes). The default
mode runs DLedger members (the broker's own core, stores on simulated disks)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

from hamq.sim.controller_world import run_controller_seed
from hamq.sim.faults import CLUSTER_SIZES
from hamq.sim.master_slave import run_master_slave_seed
from hamq.sim.policy_world import run_policy_seed
from hamq.sim.world import DEFAULT_STEPS, run_seed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hamq.sim", description=__doc__)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--seeds", type=int, default=1, help="run this many seeds from --seed")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="safety-phase ticks")
    parser.add_argument("--nodes", type=int, choices=CLUSTER_SIZES, default=None)
    parser.add_argument(
        "--mode", choices=["raft", "master-slave", "controller", "policy"], default="raft"
    )
    args = parser.parse_args(argv)
    # the stores log every torn tail a power loss leaves; in a swarm that is expected
    logging.basicConfig(level=logging.ERROR)
    if args.mode == "master-slave":
        return _master_slave(args.seed, args.seeds)
    if args.mode == "controller":
        return _controller(args.seed, args.seeds)
    if args.mode == "policy":
        return _policy(args.seed, args.seeds)
    failed = 0
    for seed in range(args.seed, args.seed + args.seeds):
        result = run_seed(seed, steps=args.steps, nodes=args.nodes)
        status = "ok" if result.ok else f"FAILED: {result.failure}"
        print(
            f"seed={seed} nodes={result.nodes} committed={result.committed} "
            f"acked={result.acknowledged} crashes={result.crashes} "
            f"messages={result.messages_sent} liveness_ms={result.liveness_ms} "
            f"trace={result.trace_hash} {status}"
        )
        if not result.ok:
            failed += 1
            print(
                f"replay with: python -m hamq.sim --seed {seed} --steps {args.steps}"
                + (f" --nodes {args.nodes}" if args.nodes else ""),
                file=sys.stderr,
            )
    return 1 if failed else 0


def _each_seed(first: int, count: int, run: Callable[[int], Any], fields: str) -> int:
    """Run seeds first..first+count-1, one line each: ``fields`` (names of the result's
    attributes) and ok or the failure; 1 if any failed."""
    failed = 0
    for seed in range(first, first + count):
        r = run(seed)
        shown = " ".join(f"{name}={getattr(r, name)}" for name in fields.split())
        print(f"seed={seed} {shown} " + ("ok" if r.ok else f"FAILED: {r.failure}"))
        failed += not r.ok
    return 1 if failed else 0


def _master_slave(first: int, count: int) -> int:
    return _each_seed(first, count, run_master_slave_seed, "acked refused timed_out")


def _controller(first: int, count: int) -> int:
    fields = "acked read crashes elections cuts partitions"
    return _each_seed(first, count, run_controller_seed, fields)


def _policy(first: int, count: int) -> int:
    fields = "nodes steps refused acked elections leader_changes"
    return _each_seed(first, count, run_policy_seed, fields)


if __name__ == "__main__":
    sys.exit(main())
