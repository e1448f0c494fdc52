"""The chaos nemeses' schedule and choices: deterministic in the seed (a run is replayed by
its seed), inside the run's duration, and every shape of partition a real partition."""

from __future__ import annotations

import random
from itertools import combinations, pairwise

import pytest

from hamq.chaos.nemesis import (
    CALM_S,
    FAULT_MIN_S,
    FAULT_S,
    MIXED,
    NEMESES,
    Schedule,
    draw_mixed,
    needs,
    nemesis_type,
    partition_shapes,
    supported,
)

DURATIONS_S = (3.0, 4.0, 6.0, 10.0, 30.0, 300.0)


def test_schedule_is_deterministic_in_the_seed():
    assert Schedule.of(7, 60) == Schedule.of(7, 60)
    assert Schedule.of(7, 60) != Schedule.of(8, 60)


@pytest.mark.parametrize("duration_s", DURATIONS_S)
def test_every_window_is_inside_the_duration_with_calm_between(duration_s):
    for seed in range(200):
        windows = Schedule.of(seed, duration_s).windows
        assert windows, f"seed {seed}: no fault in {duration_s} s"
        calm_from = 0.0
        for window in windows:
            calm = window.start_s - calm_from
            assert CALM_S[0] - 0.001 <= calm <= CALM_S[1] + 0.001, (seed, window)
            assert FAULT_MIN_S <= window.stop_s - window.start_s <= FAULT_S[1] + 0.001
            assert window.stop_s <= duration_s
            calm_from = window.stop_s


def test_a_long_run_has_many_faults():
    # calm 1–2 s + fault 2–5 s: at most 7 s a cycle
    assert len(Schedule.of(1, 300).windows) >= 300 // 7


def test_a_duration_too_short_for_a_fault_has_none():
    assert Schedule.of(1, 1.5).windows == ()


def test_every_nemesis_name_is_resolvable():
    for name in NEMESES:
        assert nemesis_type(name).name == name
    with pytest.raises(ValueError, match=r"unknown nemesis 'flood'.*kill, pause"):
        nemesis_type("flood")


def test_what_each_nemesis_needs_from_the_run():
    assert needs("loss").proxy and not needs("kill").proxy
    assert needs("clock").clock and needs("mixed").clock
    assert needs("disk-full").tmpfs
    assert needs("partition").netns


def test_partitions_are_unsupported_on_loopback_hosts():
    assert "network namespaces" in supported("partition", "loopback")
    assert supported("partition", "netns") is None
    assert all(supported(name, "loopback") is None for name in NEMESES if name != "partition")


def test_mixed_draws_several_kinds_deterministically():
    draws = [draw_mixed(random.Random(3), "netns") for _ in range(2)]
    assert draws[0] == draws[1]
    rng = random.Random(3)
    kinds = [draw_mixed(rng, "netns") for _ in range(40)]
    assert set(kinds) <= set(MIXED)
    assert len(set(kinds)) >= 4
    rng = random.Random(3)
    assert "partition" not in {draw_mixed(rng, "loopback") for _ in range(40)}


CONTROL = ["ns1", "ns2", "ns3"]
MEMBERS = ["a0", "a1", "a2"]


def reachable(hosts, cut):
    """Which hosts each host still reaches directly."""
    cut = {frozenset(pair) for pair in cut}
    return {h: {o for o in hosts if o != h and frozenset((h, o)) not in cut} for h in hosts}


@pytest.mark.parametrize("seed", range(10))
def test_each_partition_shape_cuts_what_its_name_says(seed):
    hosts = CONTROL + MEMBERS
    shapes = partition_shapes(hosts, MEMBERS)
    assert set(shapes) == {
        "majority-minority",
        "isolate-one",
        "bridge",
        "ring",
        "controller-only",
        "data-only",
    }
    for name, shape in shapes.items():
        cut = shape(random.Random(seed))
        assert cut, name
        assert all(a in hosts and b in hosts and a != b for a, b in cut), name
        sees = reachable(hosts, cut)
        if name == "majority-minority":
            sides = {frozenset({h, *sees[h]}) for h in hosts}
            assert sorted(len(side) for side in sides) == [3, 3]
        elif name == "isolate-one":
            assert sorted(len(s) for s in sees.values()).count(0) == 1
        elif name == "bridge":
            # one host (the bridge) still sees every other; no other host does
            assert [len(s) for s in sees.values()].count(len(hosts) - 1) == 1
        elif name == "ring":
            assert all(len(s) == 2 for s in sees.values())
        elif name == "controller-only":
            assert {frozenset(p) for p in cut} == {
                frozenset((c, m)) for c in CONTROL for m in MEMBERS
            }
        elif name == "data-only":
            assert {frozenset(p) for p in cut} == {frozenset(p) for p in combinations(MEMBERS, 2)}


def test_a_single_broker_has_no_data_only_cut():
    shapes = partition_shapes(["ns1", "a0"], ["a0"])
    assert "data-only" not in shapes
    assert "controller-only" in shapes


def test_shapes_are_deterministic_in_the_seed():
    hosts = CONTROL + MEMBERS
    for shape in partition_shapes(hosts, MEMBERS).values():
        assert shape(random.Random(5)) == shape(random.Random(5))


def test_windows_never_overlap():
    for seed in range(50):
        for a, b in pairwise(Schedule.of(seed, 120).windows):
            assert a.stop_s < b.start_s
