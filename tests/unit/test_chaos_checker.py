"""The chaos checker finds each anomaly it claims to: a clean run directory, written in the
run's exact line formats, is ok, and each mutation of one thing in it gives the one count
that mutation should (mutation testing of the checker itself)."""

from __future__ import annotations

import json
import math
import random
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamq.chaos import checker
from hamq.chaos.checker import ISSUE_KEYS, HistoryError, check, first_divergence, timeline

S = 1_000_000_000  # ns
T0 = 5_000 * S  # monotonic clocks do not start at 0
COMMITTED = 100
NORMAL, ORDERED = "chaos-normal", "chaos-ordered"


@dataclass
class Run:
    """A run directory's contents before they are written: lines per history file, the
    fault events, and each member's commit log bytes."""

    files: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    faults: list[dict[str, Any]] = field(default_factory=list)
    logs: dict[str, bytes] = field(default_factory=dict)
    offsets: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def line(self, file: str, t: int, **fields: Any) -> None:
        lines = self.files[file]
        lines.append({"n": len(lines) + 1, "t": t, **fields})

    def send(
        self,
        producer: int,
        seq: int,
        t: int,
        outcome: str,
        ordered: bool = False,
        after: int = S // 100,
    ) -> str:
        """A send invoked at ``t`` with its outcome ``after`` later; an ok one is stored at the
        next offset of its queue."""
        file, msg_id = f"producer-{producer}", f"p{producer}-{seq}"
        topic = ORDERED if ordered else NORMAL
        key = f"k{producer}-{seq % 2}" if ordered else msg_id
        send = {
            "op": "send",
            "id": msg_id,
            "key": key,
            "topic": topic,
            "ordered": ordered,
            "seq": seq,
        }
        self.line(file, t, type="invoke", **send)
        if outcome == "ok":
            queue = f"broker-a/{producer}"
            offset = self.store(msg_id, topic, queue, key, seq)
            self.line(file, t + after, type="ok", queue=queue, offset=offset, **send)
        elif outcome:
            self.line(file, t + after, type=outcome, error="RequestTimeout", **send)
        return msg_id

    def store(
        self, msg_id: str, topic: str, queue: str, key: str, seq: int, valid: bool = True
    ) -> int:
        """The final read's line for a copy of ``msg_id`` at the next offset of ``queue``."""
        offset = self.offsets[queue]
        self.offsets[queue] += 1
        self.line(
            "final",
            T0 + 100 * S,
            op="read",
            id=msg_id,
            topic=topic,
            queue=queue,
            offset=offset,
            valid=valid,
            key=key,
            seq=seq,
        )
        return offset

    def receive(self, consumer: str, msg_id: str, t: int, valid: bool = True) -> None:
        self.line(
            f"consumer-{consumer}",
            t,
            op="receive",
            id=msg_id,
            queue="broker-a/0",
            offset=0,
            valid=valid,
        )
        self.line(f"consumer-{consumer}", t + 1, op="ack", id=msg_id)

    def final_of(self, msg_id: str) -> list[dict[str, Any]]:
        return [line for line in self.files["final"] if line["id"] == msg_id]

    def write(self, run_dir: Path) -> Path:
        (run_dir / "history").mkdir(parents=True)
        for name, lines in self.files.items():
            text = "".join(json.dumps(line) + "\n" for line in lines)
            (run_dir / "history" / f"{name}.jsonl").write_text(text)
        (run_dir / "faults.jsonl").write_text("".join(json.dumps(f) + "\n" for f in self.faults))
        groups = {"broker-a": {"committed": COMMITTED, "logs": {}}}
        for member, data in self.logs.items():
            log_dir = run_dir / "hosts" / member / "store" / "commitlog"
            log_dir.mkdir(parents=True)
            (log_dir / f"{0:020d}").write_bytes(data)
            groups["broker-a"]["logs"][member] = str(log_dir.relative_to(run_dir))
        (run_dir / "members.json").write_text(json.dumps({"groups": groups}))
        return run_dir


LOG = bytes(range(200))


def clean_run() -> Run:
    """Two producers (normal and ordered topic), every acknowledged send stored once and in
    order, one indeterminate send never stored, one failed send, two consumer groups, a
    kill fault, and two members holding the same log."""
    run = Run()
    t = T0
    for seq in range(8):
        run.send(0, seq, t, "ok")
        run.send(1, seq, t + S // 20, "ok", ordered=True)
        t += S // 5
    run.send(0, 8, t, "info")
    run.send(0, 9, t + S // 10, "fail")
    run.send(0, 10, t + S // 5, "ok")
    for seq in range(4):
        run.receive("pull-0", f"p0-{seq}", T0 + S + seq)
        run.receive("orderly-0", f"p1-{seq}", T0 + S + seq)
    run.faults += [
        {
            "t": T0 + S // 2,
            "fault": "kill",
            "event": "start",
            "target": "broker-a-0",
            "detail": "SIGKILL",
        },
        {
            "t": T0 + S,
            "fault": "kill",
            "event": "stop",
            "target": "broker-a-0",
            "detail": "restarted",
        },
    ]
    run.logs = {"broker-a-0": LOG, "broker-a-1": LOG}
    return run


def verdict_of(run: Run, tmp_path: Path, **kwargs: Any) -> checker.Verdict:
    return check(run.write(tmp_path / "run"), **kwargs)


def test_a_clean_run_is_ok(tmp_path):
    verdict = verdict_of(clean_run(), tmp_path)
    assert verdict.ok
    assert (verdict.acknowledged, verdict.indeterminate, verdict.fails) == (17, 1, 1)
    counts = (
        verdict.lost,
        verdict.duplicated,
        verdict.reordered,
        verdict.phantom,
        verdict.divergent,
    )
    assert counts == (0, 0, 0, 0, 0)
    assert verdict.redelivered == 0 and verdict.unavailable_s == 0.0


def test_verdict_json_puts_the_issue_keys_first(tmp_path):
    verdict = verdict_of(clean_run(), tmp_path)
    as_json = json.loads(json.dumps(verdict.to_json()))
    assert tuple(as_json)[: len(ISSUE_KEYS)] == ISSUE_KEYS
    assert as_json["ok"] is True and as_json["indeterminate"] == 1


def test_an_acknowledged_id_missing_from_the_final_read_is_lost(tmp_path):
    run = clean_run()
    run.files["final"].remove(run.final_of("p0-5")[0])
    verdict = verdict_of(run, tmp_path)
    assert (verdict.lost, verdict.lost_ids, verdict.ok) == (1, ["p0-5"], False)
    assert verdict.phantom == 0


def test_loss_does_not_fail_a_run_whose_mode_does_not_promise_it(tmp_path):
    run = clean_run()
    run.files["final"].remove(run.final_of("p0-5")[0])
    verdict = verdict_of(run, tmp_path, promise_zero_loss=False)
    assert verdict.lost == 1 and verdict.ok


def test_a_read_of_an_id_never_sent_is_phantom(tmp_path):
    run = clean_run()
    run.store("p7-0", NORMAL, "broker-a/3", "p7-0", 0)
    verdict = verdict_of(run, tmp_path)
    assert (verdict.phantom, verdict.phantom_ids, verdict.ok) == (1, ["p7-0"], False)


def test_a_consumer_receive_absent_from_the_final_read_is_phantom(tmp_path):
    """An indeterminate send received, then gone: read and later not readable. Not lost
    (it was never acknowledged)."""
    run = clean_run()
    run.receive("push-0", "p0-8", T0 + 2 * S)
    verdict = verdict_of(run, tmp_path)
    assert (verdict.phantom, verdict.phantom_ids, verdict.lost) == (1, ["p0-8"], 0)


def test_a_corrupted_final_read_is_phantom_and_its_acknowledged_id_lost(tmp_path):
    run = clean_run()
    run.final_of("p0-3")[0]["valid"] = False
    verdict = verdict_of(run, tmp_path)
    assert (verdict.phantom, verdict.lost, verdict.lost_ids) == (1, 1, ["p0-3"])


def test_a_record_the_broker_refused_is_unreadable_not_phantom_and_its_id_lost(tmp_path):
    """The final read notes a record refused for good (CRC_MISMATCH, no intact copy) at its
    place: never served, so no phantom; the message in it is lost."""
    run = clean_run()  # p0-4: no consumer received it (else read, then gone)
    line = run.final_of("p0-4")[0]
    line.update(id="", valid=False, refused=True)
    verdict = verdict_of(run, tmp_path)
    assert (verdict.unreadable, verdict.phantom, verdict.lost_ids) == (1, 0, ["p0-4"])
    assert not verdict.ok


def test_read_then_lost_under_an_unpromised_fault_is_one_loss_not_a_failure(tmp_path):
    """One copy corrupted (single mode): a consumer read it before, the final read cannot.
    That phantom is the lost id itself; any other phantom still fails the run."""
    run = clean_run()
    run.receive("push-0", "p0-3", T0 + 2 * S)
    run.final_of("p0-3")[0].update(id="", valid=False, refused=True)
    verdict = verdict_of(run, tmp_path, promise_zero_loss=False)
    assert (verdict.lost, verdict.phantom, verdict.phantom_lost) == (1, 1, 1)
    assert verdict.ok
    assert not verdict_of(run, tmp_path / "promised").ok
    run.store("p7-0", NORMAL, "broker-a/3", "p7-0", 0)
    assert not verdict_of(run, tmp_path / "other", promise_zero_loss=False).ok


def test_a_corrupted_consumer_receive_is_phantom(tmp_path):
    run = clean_run()
    run.receive("pop-0", "p0-6", T0 + 2 * S, valid=False)
    verdict = verdict_of(run, tmp_path)
    assert (verdict.phantom, verdict.phantom_ids, verdict.lost) == (1, ["p0-6"], 0)


def test_a_failed_send_that_is_read_is_phantom(tmp_path):
    """``fail`` means the client was told it was not stored: a copy contradicts that."""
    run = clean_run()
    run.store("p0-9", NORMAL, "broker-a/0", "p0-9", 9)
    assert verdict_of(run, tmp_path).phantom_ids == ["p0-9"]


def test_an_indeterminate_send_is_neither_lost_when_absent_nor_phantom_when_present(tmp_path):
    absent = verdict_of(clean_run(), tmp_path / "absent")
    run = clean_run()
    run.store("p0-8", NORMAL, "broker-a/0", "p0-8", 8)
    present = verdict_of(run, tmp_path / "present")
    for verdict in (absent, present):
        assert (verdict.indeterminate, verdict.lost, verdict.phantom, verdict.ok) == (1, 0, 0, True)


def test_an_id_stored_twice_is_duplicated(tmp_path):
    run = clean_run()
    run.store("p0-2", NORMAL, "broker-a/0", "p0-2", 2)
    verdict = verdict_of(run, tmp_path)
    assert (verdict.duplicated, verdict.duplicated_ids) == (1, ["p0-2"])
    assert verdict.reordered == 0 and verdict.ok  # at-least-once: reported, not a failure


def test_bodies_that_do_not_parse_are_phantoms_each_not_duplicates(tmp_path):
    run = clean_run()
    for _ in range(2):
        run.store("", NORMAL, "broker-a/0", "", -1, valid=False)
    verdict = verdict_of(run, tmp_path)
    assert (verdict.duplicated, verdict.duplicated_ids, verdict.phantom) == (0, [], 2)


def test_a_seq_inversion_within_a_key_is_reordered(tmp_path):
    """p1-2 and p1-4 share key k1-0; storing 4 before 2 makes p1-2 out of order."""
    run = clean_run()
    first, later = run.final_of("p1-2")[0], run.final_of("p1-4")[0]
    first["offset"], later["offset"] = later["offset"], first["offset"]
    verdict = verdict_of(run, tmp_path)
    assert (verdict.reordered, verdict.reordered_ids, verdict.ok) == (1, ["p1-2"], False)


def test_an_inversion_across_keys_or_on_the_normal_topic_is_not_reordered(tmp_path):
    run = clean_run()
    for a, b in (("p1-2", "p1-3"), ("p0-2", "p0-4")):  # keys k1-0 / k1-1; normal topic
        first, later = run.final_of(a)[0], run.final_of(b)[0]
        first["offset"], later["offset"] = later["offset"], first["offset"]
    assert verdict_of(run, tmp_path).reordered == 0


def test_member_logs_differing_below_the_committed_offset_are_divergent(tmp_path):
    run = clean_run()
    run.logs["broker-a-1"] = LOG[:10] + b"\xff" + LOG[11:]
    verdict = verdict_of(run, tmp_path)
    assert (verdict.divergent, verdict.divergent_groups, verdict.ok) == (1, ["broker-a@10"], False)


def test_member_logs_differing_above_the_committed_offset_are_not_divergent(tmp_path):
    run = clean_run()
    run.logs["broker-a-1"] = LOG[:150] + b"\xff" + LOG[151:]
    assert verdict_of(run, tmp_path).divergent == 0


def test_a_member_holding_less_than_the_committed_prefix_is_divergent(tmp_path):
    run = clean_run()
    run.logs["broker-a-1"] = LOG[:60]
    assert verdict_of(run, tmp_path).divergent_groups == ["broker-a@60"]


def test_first_divergence_reads_segments_by_their_offsets_across_chunks(tmp_path, monkeypatch):
    """One member in one segment, the other in three split elsewhere; compared in 7-byte
    chunks, the first difference is still found at its exact offset."""
    monkeypatch.setattr(checker, "COMPARE_CHUNK_BYTES", 7)
    one, three = tmp_path / "one", tmp_path / "three"
    one.mkdir()
    three.mkdir()
    (one / f"{0:020d}").write_bytes(LOG)
    for start, end in ((0, 64), (64, 65), (65, 200)):
        (three / f"{start:020d}").write_bytes(LOG[start:end])
    (three / "checkpoint").write_bytes(b"not a segment")
    assert first_divergence({"a": one, "b": three}, committed=200) is None
    (three / f"{65:020d}").write_bytes(LOG[65:90] + b"\x00" + LOG[91:200])
    assert first_divergence({"a": one, "b": three}, committed=200) == 90
    assert first_divergence({"a": one, "b": three}, committed=90) is None
    (three / f"{64:020d}").unlink()  # a hole: the member holds only the first 64 bytes
    assert first_divergence({"a": one, "b": three}, committed=80) == 64
    assert first_divergence({"a": one, "b": tmp_path / "wiped"}, committed=1) == 0


def outage_run() -> Run:
    """Acks every 0.2 s, then nothing for 3 s (a send in between times out), then acks."""
    run = Run()
    t = T0
    for seq in range(5):
        run.send(0, seq, t, "ok")
        t += S // 5
    last_ack = t - S // 5 + S // 100
    run.send(0, 5, t, "info", after=S)
    run.send(0, 6, last_ack + 3 * S - S // 100, "ok")  # acknowledged 3 s after the last ack
    run.send(0, 7, last_ack + 3 * S + S // 5, "ok")
    return run


def test_gaps_between_acknowledgements_over_a_second_are_unavailable(tmp_path):
    verdict = verdict_of(outage_run(), tmp_path)
    assert verdict.unavailable_s == pytest.approx(3.0, abs=0.02)


def test_failover_is_the_wait_from_a_fault_start_to_the_first_ack_after_it(tmp_path):
    """Sends invoked after the kill at +1 s fail until +3.5 s; one sent at +3.5 s is acked
    10 ms later: 2.51 s of failover."""
    run = Run()
    run.send(0, 0, T0, "ok")
    for seq, at in enumerate((1.2, 2.0, 2.8), 1):
        run.send(0, seq, T0 + int(at * S), "fail")
    run.send(0, 4, T0 + int(3.5 * S), "ok")
    run.send(0, 5, T0 + 4 * S, "ok")
    run.faults.append(
        {"t": T0 + S, "fault": "kill", "event": "start", "target": "broker-a-0", "detail": ""}
    )
    run.faults.append(
        {"t": T0 + 9 * S, "fault": "pause", "event": "start", "target": "x", "detail": "drain"}
    )
    verdict = verdict_of(run, tmp_path)
    assert verdict.failover_s == pytest.approx(2.51)
    assert verdict.fails == 3 and verdict.ok  # the pause during the drain does not count


def test_receives_beyond_the_first_per_group_are_redelivered_not_errors(tmp_path):
    run = clean_run()
    run.receive("pull-0", "p0-1", T0 + 3 * S)  # again in the pull group
    run.receive("pull-1", "p0-2", T0 + 3 * S)  # the same group, another instance
    run.receive("push-0", "p0-1", T0 + 3 * S)  # another group: its first delivery
    verdict = verdict_of(run, tmp_path)
    assert (verdict.redelivered, verdict.ok) == (2, True)


def test_bad_history_lines_are_refused_with_file_and_line(tmp_path):
    run_dir = clean_run().write(tmp_path / "run")
    path = run_dir / "history" / "producer-0.jsonl"
    path.write_text(path.read_text() + "{not json\n")
    with pytest.raises(HistoryError, match=r"producer-0\.jsonl:\d+: not a history line"):
        check(run_dir)
    path.write_text('{"n": 1, "t": 1, "op": "send", "type": "ok", "id": "p0-99"}\n')
    with pytest.raises(HistoryError, match="never invoked: p0-99"):
        check(run_dir)
    path.write_text('{"n": 1, "t": 1, "op": "send", "type": "invoke", "id": "p0-1"}\n')
    with pytest.raises(HistoryError, match=r"producer-0\.jsonl: line 1: bad 'send' line"):
        check(run_dir)
    path.unlink()
    (run_dir / "faults.jsonl").write_text('{"t": 1, "fault": "kill", "event": "begin"}\n')
    with pytest.raises(HistoryError, match=r"faults\.jsonl: line 1: bad fault event"):
        check(run_dir)
    (run_dir / "faults.jsonl").write_text('{"t": 1, "event": "start"}\n')
    with pytest.raises(HistoryError, match=r"faults\.jsonl: bad fault line \(KeyError"):
        check(run_dir)
    (run_dir / "faults.jsonl").unlink()
    (run_dir / "members.json").write_text('{"groups": {"broker-a": {"logs": {}}}}')
    with pytest.raises(HistoryError, match=r"members\.json: not a members file"):
        check(run_dir)


def test_timeline_has_acks_and_latency_per_second_and_fault_windows(tmp_path):
    run_dir = clean_run().write(tmp_path / "run")
    series = timeline(run_dir)
    assert sum(n for _, n in series.acks_per_s) == 17
    assert [s for s, _ in series.acks_per_s] == [0.0, 1.0]
    assert all(ms == pytest.approx(10.0) for _, ms in series.p50_ms + series.p99_ms)
    assert series.faults == [(0.5, 1.0, "kill broker-a-0")]


def test_timeline_shows_an_outage_as_zero_acks_and_no_latency(tmp_path):
    series = timeline(outage_run().write(tmp_path / "run"))
    assert series.acks_per_s == [(0.0, 5.0), (1.0, 0.0), (2.0, 0.0), (3.0, 1.0), (4.0, 1.0)]
    assert [math.isnan(ms) for _, ms in series.p99_ms] == [False, True, True, False, False]


def mutated_run(mutation: int) -> Run:
    """The clean run, or one of its anomalies, for the property below."""
    run = clean_run()
    if mutation == 1:
        run.files["final"].remove(run.final_of("p0-5")[0])
    elif mutation == 2:
        run.store("p0-2", NORMAL, "broker-a/0", "p0-2", 2)
        run.receive("push-0", "p0-8", T0 + 2 * S)
    elif mutation == 3:
        first, later = run.final_of("p1-2")[0], run.final_of("p1-4")[0]
        first["offset"], later["offset"] = later["offset"], first["offset"]
    return run


@settings(max_examples=30, deadline=None)
@given(mutation=st.integers(0, 3), seed=st.integers(0, 2**32 - 1))
def test_line_order_and_how_producers_are_split_into_files_do_not_change_the_verdict(
    mutation, seed
):
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        expected = check(mutated_run(mutation).write(Path(tmp) / "as-written")).to_json()
        run = mutated_run(mutation)
        for lines in run.files.values():
            rng.shuffle(lines)
        for line in run.files.pop("producer-0"):  # one file per send of producer 0
            run.files[f"producer-0-{line['id']}"].append(line)
        rng.shuffle(run.faults)
        assert check(run.write(Path(tmp) / "shuffled")).to_json() == expected
