"""``hamq bench ... --plot FILE.png`` against real servers: the PNG is written and the
bench's own output is what it was; a progress bar shows on a terminal, never when piped."""

from __future__ import annotations

import json
import sys

from pty_run import run_in_pty

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
COUNT = 20_000
BENCH_KEYS = {"bench", "messages", "elapsed_s", "msgs_per_s", "mb_per_s", "p50_ms", "p99_ms"}
BENCH_KEYS |= {"p999_ms", "errors", "params"}


def test_bench_plots_and_shows_a_bar_only_on_a_terminal(cluster, hamq_cli, tmp_path):
    ns = ["--namesrv", cluster.namesrv, "--topic", "PlotT", "--max-seconds", "30"]
    sent_png = tmp_path / "produce.png"

    sent = hamq_cli(
        "bench", "produce", "--count", str(COUNT), "--size", "100", "--json", *ns,
        "--plot", str(sent_png),
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    assert sent.stderr == ""  # piped: no bar
    result = json.loads(sent.stdout)
    assert result.keys() == BENCH_KEYS  # --plot adds nothing to the result
    assert result["messages"] == COUNT and result["errors"] == 0
    assert sent_png.read_bytes().startswith(PNG_SIGNATURE)

    code, drawn = run_in_pty(
        [sys.executable, "-m", "hamq.cli.main", "bench", "produce", "--count", str(COUNT),
         "--size", "100", *ns],
        timeout_s=60,
    )  # fmt: skip
    assert code == 0, drawn
    assert "bench produce" in drawn  # the bar's description
    assert f"produce: {COUNT} msgs in" in drawn  # and the usual text line after it
