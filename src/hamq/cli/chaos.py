"""``hamq chaos run|matrix``: the chaos suite from the command line.

``run`` is one mode under one nemesis and prints one verdict line (``--json``: one object,
the issue's keys first). Its exit code says whether the mode kept its promise: 0 when the
verdict is ok (a loss the mode does not promise against is ok), 1 when it lost, invented
or diverged where it promised not to, or never recovered after healing, 2 on bad usage or
a fault these hosts cannot inject (partitions need network namespaces).

``matrix`` runs every pair, repeated, and writes docs/RELIABILITY.md with the exact
command line; it exits 1 when any run broke its promise.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import click

from hamq.chaos.checker import ISSUE_KEYS
from hamq.chaos.cluster import ClusterFailed
from hamq.chaos.hosts import Unsupported
from hamq.chaos.layout import MODES
from hamq.chaos.matrix import Matrix, broken, run_matrix
from hamq.chaos.nemesis import NEMESES
from hamq.chaos.runner import BadRun, RunSpec, default_run_dir, run
from hamq.cli.common import json_option
from hamq.cli.progress import progress, shown

UNSUPPORTED_EXIT = 2
hosts_option = click.option(
    "--hosts",
    "hosts_kind",
    type=click.Choice(["netns", "loopback"]),
    default="netns",
    show_default=True,
    help="Test hosts: a network namespace each (loopback where none can be made), or loopback.",
)


@click.group()
def chaos() -> None:
    """Chaos runs: real clusters on test hosts under faults, checked from their histories."""


@chaos.command("run")
@click.option("--mode", required=True, type=click.Choice(MODES))
@click.option("--nemesis", required=True, type=click.Choice(NEMESES))
@click.option(
    "--duration",
    "duration_s",
    default=30.0,
    show_default=True,
    type=float,
    help="Seconds of faults.",
)
@click.option(
    "--seed", default=1, show_default=True, type=int, help="Replays a run: schedule and choices."
)
@click.option(
    "--dir",
    "run_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="The run's directory: histories, faults, verdict "
    "[default: .hamq-chaos/<mode>-<nemesis>-<seed>].",
)
@hosts_option
@json_option
def chaos_run(
    mode: str,
    nemesis: str,
    duration_s: float,
    seed: int,
    run_dir: Path | None,
    hosts_kind: str,
    as_json: bool,
) -> None:
    """One run of MODE under NEMESIS; prints its verdict."""
    run_dir = run_dir or default_run_dir(mode, nemesis, seed)
    say = _say(not as_json)
    try:
        run(mode, nemesis, duration_s, seed, run_dir, say, hosts_kind)
    except Unsupported as err:
        _emit({"mode": mode, "nemesis": nemesis, "seed": seed, "unsupported": str(err)}, as_json)
        sys.exit(UNSUPPORTED_EXIT)
    except BadRun as err:
        raise click.UsageError(str(err)) from None
    except ClusterFailed as err:  # the cluster never started: no run, no verdict
        raise click.ClickException(f"{mode} cluster did not start: {err}") from None
    row = json.loads((run_dir / "verdict.json").read_text())
    _emit({**row, "run_dir": str(run_dir)}, as_json)
    sys.exit(0 if row["ok"] and row["recovered"] else 1)


@chaos.command("matrix")
@click.option("--modes", default=",".join(MODES), show_default=True, help="Comma-separated modes.")
@click.option(
    "--nemeses", default=",".join(NEMESES), show_default=True, help="Comma-separated nemeses."
)
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 100))
@click.option(
    "--duration",
    "duration_s",
    default=30.0,
    show_default=True,
    type=float,
    help="Seconds of faults per run.",
)
@click.option(
    "--seed", default=1, show_default=True, type=int, help="The first run's seed; repeats add 1."
)
@click.option(
    "--out",
    default="docs/RELIABILITY.md",
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
)
@click.option(
    "--runs-dir",
    default=".hamq-chaos/matrix",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Every run's directory, kept for replay.",
)
@hosts_option
@json_option
def chaos_matrix(
    modes: str,
    nemeses: str,
    repeat: int,
    duration_s: float,
    seed: int,
    out: Path,
    runs_dir: Path,
    hosts_kind: str,
    as_json: bool,
) -> None:
    """Every mode × nemesis, REPEAT times; writes the reliability report and its plots."""
    matrix = Matrix(
        _pick(modes, MODES, "--modes"),
        _pick(nemeses, NEMESES, "--nemeses"),
        repeat,
        duration_s,
        seed,
        out,
        runs_dir,
        hosts_kind,
    )
    try:
        RunSpec(matrix.modes[0], matrix.nemeses[0], duration_s, seed).validate()
    except BadRun as err:
        raise click.UsageError(str(err)) from None
    command = shlex.join(["hamq", *sys.argv[1:]])
    with progress(matrix.runs, "chaos matrix", not as_json) as advance:
        rows = run_matrix(matrix, command, advance, _say(not as_json and not shown(True)))
    if as_json:
        click.echo(json.dumps(rows, sort_keys=False))
    else:
        for row in rows:
            click.echo(verdict_line(row))
        click.echo(f"wrote {out}")
    sys.exit(1 if broken(rows) else 0)


def verdict_line(row: dict[str, Any]) -> str:
    """One run in one line: which run, whether it kept its promise, and the figures."""
    name = f"{row['mode']} {row['nemesis']} seed={row.get('seed')}"
    if "unsupported" in row:
        return f"{name}: UNSUPPORTED ({row['unsupported']})"
    if "error" in row:
        return f"{name}: ERROR ({row['error']})"
    if not row["recovered"]:
        status = "UNAVAILABLE (not healthy after healing)"
    elif row["ok"]:
        status = "OK" if row["promise_covers"] else f"OK (not promised: {row['unpromised_why']})"
    else:
        status = "BROKEN PROMISE"
    figures = " ".join(
        f"{k}={row[k]:.1f}" if isinstance(row[k], float) else f"{k}={row[k]}" for k in ISSUE_KEYS
    )
    where = f"faults={row['faults']} hosts={row['hosts']} dir={row.get('run_dir', '')}"
    if not row.get("divergence_checked", True):
        where += " (members not asked: divergence not checked)"
    return f"{name}: {status} {figures} {where}"


def _emit(row: dict[str, Any], as_json: bool) -> None:
    click.echo(json.dumps(row) if as_json else verdict_line(row))


def _pick(value: str, allowed: tuple[str, ...], option: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise click.BadParameter(
            f"{', '.join(unknown) or 'none given'}: choose from {', '.join(allowed)}",
            param_hint=option,
        )
    return names


def _say(enabled: bool) -> Any:
    """Progress lines on stderr (not with --json, not under a progress bar)."""

    def say(message: str) -> None:
        if enabled:
            click.echo(message, err=True)

    return say
