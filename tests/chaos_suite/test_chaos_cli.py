"""``hamq chaos run|matrix`` from the command line: one verdict line or one JSON object with
the issue's keys, the exit code telling a kept promise from a broken one, and bad input
refused with a clear message before any process starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from hamq.chaos.checker import ISSUE_KEYS, check
from hamq.cli.main import cli

RUN_TIMEOUT_S = 240


def chaos(*args: str):
    return CliRunner().invoke(cli, ["chaos", *args])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_prints_one_json_verdict_and_exits_0_on_a_kept_promise(tmp_path):
    run_dir = tmp_path / "run"
    argv = ["--mode", "single", "--nemesis", "kill", "--duration", "4", "--seed", "3"]
    argv += ["--dir", str(run_dir), "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "hamq.cli.main", "chaos", "run", *argv],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = done.stdout.splitlines()
    verdict = json.loads(line)
    assert list(verdict)[: len(ISSUE_KEYS)] == list(ISSUE_KEYS)
    assert verdict["acknowledged"] > 0 and verdict["lost"] == 0
    assert (verdict["mode"], verdict["nemesis"], verdict["seed"]) == ("single", "kill", 3)
    kept = json.loads((run_dir / "verdict.json").read_text())
    assert verdict == {**kept, "run_dir": str(run_dir)}
    assert (run_dir / "timeline.png").stat().st_size > 0
    # a kept run, moved, is checked against its own member logs (there is one to compare)
    moved = run_dir.rename(tmp_path / "moved")
    assert json.loads((moved / "members.json").read_text())["groups"]["broker-a"]["committed"] > 0
    assert check(moved).divergent == 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["run", "--mode", "raid", "--nemesis", "kill"], "'raid' is not one of"),
        (["run", "--mode", "single", "--nemesis", "flood"], "'flood' is not one of"),
        (["run", "--mode", "single", "--nemesis", "kill", "--duration", "0"], "duration"),
        (["run", "--mode", "single", "--nemesis", "kill", "--duration", "-3"], "duration"),
        (["matrix", "--modes", "single,raid"], "raid: choose from single"),
        (["matrix", "--nemeses", ","], "none given"),
        (["matrix", "--repeat", "0"], "0 is not in the range"),
    ],
)
def test_bad_input_is_refused_before_anything_starts(args, says, tmp_path):
    result = chaos(*args, "--dir" if args[0] == "run" else "--runs-dir", str(tmp_path / "runs"))
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert not (tmp_path / "runs").exists()


def test_a_directory_holding_something_else_is_not_emptied(tmp_path):
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    result = chaos("run", "--mode", "single", "--nemesis", "kill", "--dir", str(keep))
    assert result.exit_code == 2
    assert "holds no chaos run" in result.output
    assert (keep / "notes.txt").read_text() == "mine"


def test_a_partition_on_loopback_hosts_is_unsupported_not_a_traceback(tmp_path):
    result = chaos(
        "run", "--mode", "controller", "--nemesis", "partition", "--hosts", "loopback", "--json",
        "--dir", str(tmp_path / "run"),
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    answer = json.loads(result.stdout)
    assert "network namespaces" in answer["unsupported"]
    assert not (tmp_path / "run" / "hosts").exists()  # nothing was started


def test_a_matrix_of_unsupported_runs_says_so_and_writes_the_report(tmp_path):
    out = tmp_path / "docs" / "RELIABILITY.md"
    result = chaos(
        "matrix", "--modes", "single,dledger", "--nemeses", "partition", "--hosts", "loopback",
        "--out", str(out), "--runs-dir", str(tmp_path / "runs"),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == [
        "single partition seed=1",
        "dledger partition seed=1",
    ]
    assert all("UNSUPPORTED (partition needs network namespaces" in line for line in lines[:2])
    assert "hamq chaos matrix" in out.read_text()
