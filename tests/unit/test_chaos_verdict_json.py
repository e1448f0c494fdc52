"""A run whose members could not be asked has no members.json: its verdict must say that
divergent=0 was not looked at, not pass it off as checked (reviewer R1, issue 18)."""

from __future__ import annotations

import json

from tests.unit.test_chaos_checker import clean_run, verdict_of

from hamq.chaos.runner import RunSpec, verdict_json
from hamq.cli.chaos import verdict_line


def test_a_run_without_members_json_says_divergence_was_not_checked(tmp_path):
    verdict = verdict_of(clean_run(), tmp_path)
    spec = RunSpec("controller", "kill", 5.0, 1)
    row = verdict_json(spec, verdict, "netns", True, tmp_path)
    assert row["divergence_checked"] is False
    assert "divergence not checked" in verdict_line({**row, "run_dir": str(tmp_path)})

    (tmp_path / "members.json").write_text(json.dumps({"groups": {}}))
    row = verdict_json(spec, verdict, "netns", True, tmp_path)
    assert row["divergence_checked"] is True
    assert "divergence not checked" not in verdict_line({**row, "run_dir": str(tmp_path)})
