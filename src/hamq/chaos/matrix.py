"""``hamq chaos matrix``: every mode × nemesis, repeated, and docs/RELIABILITY.md from the
verdicts — one row per pair, with the pair's first timeline copied beside the report
(docs/reliability/<mode>-<nemesis>.png) so the published figures link to their plots.

A run that cannot be done here (a partition on loopback hosts) is a result saying so; a
run that crashes is a result with its error, and the matrix goes on: one broken run must
not hide the figures of the others.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hamq.chaos.hosts import Unsupported, netns_available
from hamq.chaos.report import write_reliability_md
from hamq.chaos.runner import Progress, promise_note, run

PLOTS_DIR = "reliability"  # beside the report


@dataclass(frozen=True)
class Matrix:
    modes: tuple[str, ...]
    nemeses: tuple[str, ...]
    repeat: int
    duration_s: float
    seed: int  # the first repeat's; each repeat adds 1
    out: Path  # the report
    runs_dir: Path  # one directory per run under it, kept for replay
    hosts_kind: str = "netns"  # runner.run's: namespaces where they can be made, or loopback

    @property
    def runs(self) -> int:
        return len(self.modes) * len(self.nemeses) * self.repeat


def run_matrix(
    matrix: Matrix, command: str, advance: Callable[[int], None], say: Progress
) -> list[dict[str, Any]]:
    """Every run of the matrix, in order; writes the report and its plots; returns one
    result per run (its verdict.json, or why there is none)."""
    plots = matrix.out.parent / PLOTS_DIR
    plots.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for mode in matrix.modes:
        for nemesis in matrix.nemeses:
            pair: list[dict[str, Any]] = []
            for i in range(matrix.repeat):
                seed = matrix.seed + i
                say(f"{mode} × {nemesis}, seed {seed}")
                pair.append(_one(matrix, mode, nemesis, seed, say))
                advance(1)
            results += pair
            verdicts = [r for r in pair if "ok" in r]
            row: dict[str, Any] = {
                "mode": mode,
                "nemesis": nemesis,
                **promise_note(mode, nemesis),
                "verdicts": verdicts,
            }
            if verdicts:
                plot = plots / f"{mode}-{nemesis}.png"
                shutil.copyfile(Path(verdicts[0]["run_dir"]) / "timeline.png", plot)
                row["plot"] = f"{PLOTS_DIR}/{plot.name}"
            else:  # unsupported or crashed every time: a row saying so, never a silent gap
                row["unsupported"] = pair[-1].get("unsupported", "")
                row["error"] = pair[-1].get("error", "")
            rows.append(row)
    kinds = {r["hosts"] for r in results if "hosts" in r}
    hosts_kind = (
        kinds.pop()
        if len(kinds) == 1
        else "netns"
        if matrix.hosts_kind == "netns" and netns_available()
        else "loopback"
    )
    write_reliability_md(rows, matrix.out, command, hosts_kind)
    return results


def _one(matrix: Matrix, mode: str, nemesis: str, seed: int, say: Progress) -> dict[str, Any]:
    run_dir = matrix.runs_dir / f"{mode}-{nemesis}-{seed}"
    base = {"mode": mode, "nemesis": nemesis, "seed": seed, "run_dir": str(run_dir)}
    try:
        run(mode, nemesis, matrix.duration_s, seed, run_dir, say, matrix.hosts_kind)
    except Unsupported as err:  # these hosts cannot inject this fault
        return {**base, "unsupported": str(err)}
    except Exception as err:  # noqa: BLE001 - one crashed run is a result; the matrix goes on
        say(f"{mode} × {nemesis} failed: {type(err).__name__}: {err}")
        return {**base, "error": f"{type(err).__name__}: {err}"}
    return {**json.loads((run_dir / "verdict.json").read_text()), **base}


def broken(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs that broke their mode's promise, never recovered, or crashed."""
    return [
        r for r in results if "unsupported" not in r and not (r.get("ok") and r.get("recovered"))
    ]
