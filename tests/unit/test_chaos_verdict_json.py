"""What a chaos run's verdict admits it did not do (reviewer R1, issue 18): a divergence it
could not check (no members.json), a fault the mode's layout cannot inject."""

from __future__ import annotations

import json

from tests.unit.test_chaos_checker import clean_run, verdict_of

from hamq.chaos.runner import RunSpec, verdict_json, why_unsupported
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


def test_frame_loss_is_unsupported_where_no_proxy_sits_on_the_data_path():
    """mirrored: placed members listen on ports picked at run time, not behind proxies, so
    a loss run would pass without one send or replication frame lost."""
    assert "FrameProxies" in (why_unsupported("mirrored", "loss", "netns") or "")
    assert why_unsupported("controller", "loss", "netns") is None
    assert why_unsupported("mirrored", "kill", "netns") is None
