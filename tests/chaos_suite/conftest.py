"""The short chaos matrix (``make test``): one real run per case, its directory under the
test's tmp_path (kept by pytest for the last runs, so a failure can be replayed and read)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from hamq.chaos.hosts import Unsupported
from hamq.chaos.runner import run

# A few seconds of faults: at least one window (calm <= 2 s, then a fault of >= 2 s).
DURATION_S = 5.0
SEED = 18


@pytest.fixture
def promised_run(tmp_path: Path) -> Callable[[str, str], dict]:
    """``promised_run(mode, nemesis)``: a run in tmp_path/run, checked (``check_promise``)."""

    def one(mode: str, nemesis: str) -> dict:
        return check_promise(mode, nemesis, tmp_path / "run")

    return one


def check_promise(mode: str, nemesis: str, run_dir: Path, seed: int = SEED) -> dict:
    """One run; asserts it acknowledged sends, injected the fault, recovered, and kept the
    mode's promise (0 lost, 0 phantom, 0 divergent, 0 reordered); returns verdict.json."""
    try:
        run(mode, nemesis, DURATION_S, seed, run_dir)
    except Unsupported as err:
        pytest.skip(str(err))
    verdict = json.loads((run_dir / "verdict.json").read_text())
    replay = f"{mode} × {nemesis} seed {seed}, run dir {run_dir}: {json.dumps(verdict)}"
    starts = [
        json.loads(line)
        for line in (run_dir / "faults.jsonl").read_text().splitlines()
        if json.loads(line)["event"] == "start"
    ]
    assert starts, f"no fault injected: {replay}"
    assert verdict["acknowledged"] > 0, f"nothing acknowledged: {replay}"
    assert verdict["promise_covers"], replay
    assert verdict["recovered"], f"not healthy after healing: {replay}"
    assert (verdict["lost"], verdict["phantom"], verdict["divergent"], verdict["reordered"]) == (
        0,
        0,
        0,
        0,
    ), replay
    assert verdict["ok"], replay
    return verdict
