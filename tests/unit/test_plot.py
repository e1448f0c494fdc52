"""``hamq.plot`` draws real PNGs from time series, and a bench's timeline samples the
counters it is given into per-interval rates and latency percentiles."""

from __future__ import annotations

import asyncio
import math
import struct
from array import array

import pytest

from hamq.cli.bench_timeline import Timeline, timeline_of
from hamq.plot import Panel, _label_sides, plot_series

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, which must come first."""
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_series_writes_a_png_with_a_panel_each(tmp_path):
    seconds = [i * 0.25 for i in range(120)]
    rate = [(t, 0.0 if 10 <= t < 12 else 40_000 + 500 * math.sin(t)) for t in seconds]
    p99 = [(t, math.nan if 10 <= t < 12 else 3.0) for t in seconds]  # a gap while nothing ends
    events = [(10.0, "kill -9 master"), (12.1, "new master")]
    one, two = tmp_path / "one.png", tmp_path / "two.png"

    plot_series(one, "one panel", [Panel("throughput (msgs/s)", {"msgs/s": rate}, events)])
    plot_series(
        str(two),
        "two panels",
        [
            Panel("throughput (msgs/s)", {"msgs/s": rate}, events),
            Panel("latency (ms)", {"p50": p99, "p99": p99}, events),
        ],
    )

    width_one, height_one = png_size(one.read_bytes())
    width_two, height_two = png_size(two.read_bytes())
    assert width_one == width_two >= 800  # readable without zooming
    assert height_two > height_one  # the second panel is stacked under the first


def test_labels_of_close_events_go_either_side_of_their_lines():
    """Two events within 2% of the time axis: the earlier label left, the later right."""
    events = [(20.0, "first lock"), (1.9, "in routes"), (2.0, "lock"), (0.1, "kill")]
    assert _label_sides(events, span=30.0) == [False, True, False, False]


def test_plot_series_refuses_no_panels(tmp_path):
    with pytest.raises(ValueError, match="at least one panel"):
        plot_series(tmp_path / "none.png", "nothing", [])
    assert not (tmp_path / "none.png").exists()


def test_timeline_samples_rates_and_latency_of_each_interval(tmp_path):
    """A counter growing 100 per 10 ms with 1 ms latencies: rates near 10,000/s, p50 1 ms,
    the progress bar advanced by exactly what was counted, the events placed in time."""
    advanced: list[int] = []
    plot = tmp_path / "timeline.png"
    timeline = Timeline(str(plot), advanced.append, interval_s=0.05)
    state = {"done": 0, "failed": 0}
    latencies = array("d")

    async def run() -> None:
        timeline.follow(lambda: state["done"], latencies, lambda: state["failed"])
        for i in range(40):
            await asyncio.sleep(0.01)
            state["done"] += 100
            latencies.extend([0.001] * 10)
            if i == 20:
                timeline.mark("kill -9 master")
                state["failed"] += 1
        await timeline.stop()

    asyncio.run(run())

    assert sum(advanced) == 4000
    assert len(timeline.rate) >= 4
    middle = [rate for _, rate in timeline.rate[1:-1]]
    assert all(1000 < rate < 20_000 for rate in middle), timeline.rate
    assert {p for _, p in timeline.p50_ms} == {1.0}
    assert sum(1 for _, r in timeline.error_rate if r) == 1
    [(at, label)] = timeline.events
    assert label == "kill -9 master" and 0.1 < at < timeline.rate[-1][0]
    timeline.draw("a test run")
    assert png_size(plot.read_bytes())[0] >= 800


def test_timeline_without_plot_or_bar_keeps_nothing(tmp_path):
    timeline = Timeline()

    async def run() -> None:
        timeline.follow(lambda: 1, array("d", [0.001]))
        await asyncio.sleep(0.3)
        await timeline.stop()

    asyncio.run(run())
    assert timeline.rate == [] and timeline.p50_ms == []
    timeline.draw("nothing")  # no file asked for: nothing written
    assert list(tmp_path.iterdir()) == []


def test_timeline_of_recorded_sends_bins_them_by_acknowledgement(tmp_path):
    """Sends kept as (begun, acknowledged): per 0.25 s their rate and latency; a stretch
    with no acknowledgement (a failover) is a zero rate and a gap in latency."""
    started = 100.0
    sends = [(started + i * 0.01, started + i * 0.01 + 0.002) for i in range(50)]  # 0-0.5 s
    sends += [(started + 0.6, started + 1.1)]  # blocked across the gap, acked at 1.1 s
    timeline = timeline_of(sends, started, str(tmp_path / "sends.png"))
    timeline.mark("kill -9 master", started + 0.55)

    assert [t for t, _ in timeline.rate] == [0.25, 0.5, 0.75, 1.0, 1.25]
    assert [round(r) for _, r in timeline.rate] == [100, 100, 0, 0, 4]
    assert [round(p, 3) for _, p in timeline.p50_ms[:2]] == [2.0, 2.0]
    assert math.isnan(timeline.p50_ms[2][1]) and math.isnan(timeline.p50_ms[3][1])
    assert timeline.p99_ms[4] == (1.25, 500.0)
    assert timeline.events == [(0.55, "kill -9 master")]
    timeline.draw("recorded sends")
    assert png_size((tmp_path / "sends.png").read_bytes())[0] >= 800


def test_plot_path_that_cannot_be_written_is_refused_before_the_bench_runs(tmp_path):
    """The PNG is drawn after the run: a --plot path whose directory does not exist (or is
    a file) was found out then, with a traceback, the bench's minutes and result lost.
    (Every bench's --plot is the one option, ``plot_option``.)"""
    from click.testing import CliRunner

    from hamq.cli.main import cli

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    for path in (tmp_path / "missing" / "run.png", not_a_dir / "run.png", tmp_path):
        # a name server nobody serves: the bench must not even try it
        args = ["bench", "produce", "--namesrv", "127.0.0.1:1", "--plot", str(path)]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, (path, result.output, result.exception)
        assert "--plot" in result.output and "unreachable" not in result.output, result.output
    assert not (tmp_path / "missing").exists() and not_a_dir.read_text() == ""
