"""The chaos checker: a run's verdict from the files it left behind (``history/*.jsonl``,
``faults.jsonl``, ``members.json``), with no sockets and no clocks, so a kept run directory
can be checked again — or by a newer checker — at any time.

A producer's send is *acknowledged* when its history has an ``ok`` for it (SEND_OK),
*failed* on ``fail`` (the client was told it was not stored) and *indeterminate* on ``info``
or no outcome at all (a timeout, a lost connection: it may or may not be stored, so it is
never counted lost when absent nor phantom when present). A copy is *readable* when the
drain after healing (``final.jsonl``) read it with a valid body (it parses, its crc matches).

Definitions (the legend of docs/RELIABILITY.md):

- **acknowledged**: sends the broker answered SEND_OK.
- **indeterminate**: sends with no definite answer (a timeout, a lost connection): never
  counted lost when absent nor phantom when present.
- **lost**: acknowledged ids with no readable copy in the final read.
- **duplicated**: ids the final read holds more than once.
- **reordered**: on the ordered topic, acknowledged messages stored after a message of the
  same key with a higher seq, in the same queue (each such message counts once).
- **phantom**: ids read (by a consumer or the final read) that no producer sent or whose send
  failed definitely; reads with an invalid body (corrupted); ids a consumer received that
  the final read no longer holds (read, then gone).
- **unreadable**: records the final read found but the broker refused for good (damaged,
  no intact copy): never served, so not phantom; the message they held counts as lost.
- **divergent**: replica groups whose members' commit logs differ below the group's committed
  offset, or where a member holds less than the committed prefix after healing.
- **unavailable_s**: the sum of the gaps longer than 1 s between consecutive acknowledgements
  (all producers together), from the first send to the last.
- **failover_s**: the longest time, over fault starts, from the start to the first
  acknowledgement of a send invoked after it (to the last send when none was acknowledged).
- **redelivered**: receives of an id beyond the first in one consumer group (at-least-once
  delivery: reported, not an error).

A run is ok when lost, phantom, divergent and reordered are all 0. When the mode does not
promise zero loss under this fault, lost and divergent are allowed, and so are phantoms that
are lost ids (read, then lost: one loss seen twice), not other phantoms nor reorderings.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from math import nan
from pathlib import Path
from typing import Any

from hamq.chaos.history import read_history
from hamq.cli.bench import percentile_ms
from hamq.store.commitlog import SEGMENT_NAME_DIGITS

NS_PER_S = 1_000_000_000
# A pause between acknowledgements shorter than this is load, not unavailability.
UNAVAILABLE_GAP_S = 1.0
# Ids listed per anomaly in a verdict: enough to start replaying, small enough to print.
MAX_LISTED_IDS = 20
# Commit logs are compared in pieces of this size: a long run's logs do not fit in memory twice.
COMPARE_CHUNK_BYTES = 1024 * 1024
ISSUE_KEYS = (
    "acknowledged",
    "lost",
    "duplicated",
    "reordered",
    "phantom",
    "divergent",
    "unavailable_s",
    "failover_s",
)


class HistoryError(ValueError):
    """A history file that cannot be read as the run's format: which file, which line."""


@dataclass
class Verdict:
    acknowledged: int
    lost: int
    duplicated: int
    reordered: int
    phantom: int
    divergent: int
    unavailable_s: float
    failover_s: float
    indeterminate: int
    fails: int
    redelivered: int
    lost_ids: list[str] = field(default_factory=list)
    duplicated_ids: list[str] = field(default_factory=list)
    reordered_ids: list[str] = field(default_factory=list)
    phantom_ids: list[str] = field(default_factory=list)
    divergent_groups: list[str] = field(default_factory=list)  # "group@first differing byte"
    unreadable: int = 0
    phantom_lost: int = 0  # phantoms that are lost ids: read, then lost
    promise_zero_loss: bool = True

    @property
    def ok(self) -> bool:
        if self.reordered:
            return False
        if self.promise_zero_loss:
            return self.lost == self.phantom == self.divergent == 0
        return self.phantom == self.phantom_lost

    def to_json(self) -> dict[str, Any]:
        fields = asdict(self)
        ordered = {key: fields.pop(key) for key in ISSUE_KEYS}
        return {**ordered, **fields, "ok": self.ok}


@dataclass
class Send:
    """One producer's send of one id: its invoke and outcome."""

    id: str
    key: str
    topic: str
    ordered: bool
    seq: int
    invoked_t: int
    outcome: str = ""  # "ok" | "fail" | "info" | "" (the history ends before an outcome)
    done_t: int = 0


@dataclass(frozen=True)
class Read:
    id: str
    topic: str
    queue: str
    offset: int
    valid: bool
    refused: bool = False  # the broker refused it for good (final read only): never served


@dataclass(frozen=True)
class FaultWindow:
    fault: str
    target: str
    start_t: int
    stop_t: int | None  # None: never stopped in the history


@dataclass
class History:
    sends: dict[str, Send]
    receives: dict[str, list[Read]]  # by consumer group
    final: list[Read]
    faults: list[FaultWindow]


@dataclass
class Timeline:
    """Per-second series from the first send, for the run's plot."""

    acks_per_s: list[tuple[float, float]]
    p50_ms: list[tuple[float, float]]
    p99_ms: list[tuple[float, float]]
    faults: list[tuple[float, float | None, str]]  # (start s, stop s, "fault target")


def check(run_dir: Path, promise_zero_loss: bool = True) -> Verdict:
    """The verdict of the run kept in ``run_dir``."""
    history = load_history(run_dir)
    sends = history.sends
    acked = {i for i, s in sends.items() if s.outcome == "ok"}
    readable = Counter(r.id for r in history.final if r.valid)
    stored = Counter(r.id for r in history.final)
    lost = sorted(acked - readable.keys())
    # "" is every body that does not parse: phantoms each, not copies of one message
    duplicated = sorted(i for i, n in stored.items() if n > 1 and i)
    reordered = _reordered(history.final, sends, acked)
    phantom = _phantoms(history, readable)
    lost_set = set(lost)
    divergent = _divergent(run_dir)
    redelivered = sum(
        sum(Counter(r.id for r in reads).values()) - len({r.id for r in reads})
        for reads in history.receives.values()
    )
    return Verdict(
        acknowledged=len(acked),
        lost=len(lost),
        duplicated=len(duplicated),
        reordered=len(reordered),
        phantom=len(phantom),
        divergent=len(divergent),
        unavailable_s=unavailable_s(list(sends.values())),
        failover_s=failover_s(list(sends.values()), history.faults),
        indeterminate=sum(1 for s in sends.values() if s.outcome in ("info", "")),
        fails=sum(1 for s in sends.values() if s.outcome == "fail"),
        redelivered=redelivered,
        lost_ids=lost[:MAX_LISTED_IDS],
        duplicated_ids=duplicated[:MAX_LISTED_IDS],
        reordered_ids=reordered[:MAX_LISTED_IDS],
        phantom_ids=phantom[:MAX_LISTED_IDS],
        divergent_groups=divergent[:MAX_LISTED_IDS],
        unreadable=sum(1 for r in history.final if r.refused),
        phantom_lost=sum(1 for i in phantom if i in lost_set),
        promise_zero_loss=promise_zero_loss,
    )


def load_history(run_dir: Path) -> History:
    """Every history file of the run. Lines are told apart by ``op``, not by file name, so
    how the runner split its clients into files does not matter; the consumer group of a
    receive is its file's ``consumer-<kind>`` (or the line's ``group``)."""
    history = History(sends={}, receives=defaultdict(list), final=[], faults=[])
    files = sorted((run_dir / "history").glob("*.jsonl"))
    if not files:
        raise HistoryError(f"no history files in {run_dir / 'history'}")
    for path in files:
        for where, line in _lines(path):
            _take(history, path, where, line)
    never_invoked = sorted(i for i, s in history.sends.items() if not s.topic)
    if never_invoked:
        raise HistoryError(f"outcomes of sends never invoked: {', '.join(never_invoked[:5])}")
    history.faults = _fault_windows(run_dir / "faults.jsonl")
    return history


def _lines(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each line of a history file with where it is, for errors (a torn last line is
    dropped by :func:`read_history`: the writer was killed while writing it)."""
    try:
        lines = read_history(path)
    except ValueError as exc:
        raise HistoryError(str(exc)) from None
    for number, line in enumerate(lines, 1):
        if not isinstance(line, dict):
            raise HistoryError(f"{path}: line {number} is not a JSON object")
        yield f"{path}: line {number}", line


def _take(history: History, path: Path, where: str, line: dict[str, Any]) -> None:
    try:
        op = line["op"]
        if op == "send":
            _take_send(history.sends, where, line)
        elif op == "receive":
            group = line.get("group") or "-".join(path.stem.split("-")[:2])
            history.receives[group].append(_read(line, topic=line.get("topic", "")))
        elif op == "read":
            history.final.append(_read(line, topic=line["topic"]))
        elif op != "ack":  # a consumer's ack adds nothing its receive did not say
            raise HistoryError(f"{where}: unknown op {op!r}")
    except HistoryError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise HistoryError(f"{where}: bad {line.get('op')!r} line ({exc!r})") from None


def _take_send(sends: dict[str, Send], where: str, line: dict[str, Any]) -> None:
    send_id, kind = str(line["id"]), line["type"]
    if kind == "invoke":
        send = sends.setdefault(send_id, Send(send_id, "", "", False, 0, 0))
        if send.topic:
            raise HistoryError(f"{where}: {send_id} invoked twice (ids are unique per run)")
        send.key, send.topic = str(line["key"]), str(line["topic"])
        send.ordered, send.seq, send.invoked_t = (
            bool(line["ordered"]),
            int(line["seq"]),
            int(line["t"]),
        )
        return
    if kind not in ("ok", "fail", "info"):
        raise HistoryError(f"{where}: unknown send type {kind!r}")
    send = sends.get(send_id)
    # Files are read one after another: the outcome may come before its invoke. It is kept,
    # the invoke fills in the rest (load_history refuses an outcome that never gets one).
    if send is None:
        send = sends[send_id] = Send(send_id, "", "", False, 0, 0)
    if send.outcome:
        raise HistoryError(f"{where}: {send_id} has a second outcome {kind!r}")
    send.outcome, send.done_t = kind, int(line["t"])


def _read(line: dict[str, Any], topic: str) -> Read:
    return Read(
        id=str(line["id"]),
        topic=str(topic),
        queue=str(line["queue"]),
        offset=int(line["offset"]),
        valid=bool(line["valid"]),
        refused=bool(line.get("refused", False)),
    )


def _fault_windows(path: Path) -> list[FaultWindow]:
    """Each fault start paired with the next stop of the same fault and target."""
    if not path.exists():
        return []
    try:
        events = sorted((int(line["t"]), where, line) for where, line in _lines(path))
        for _, where, line in events:
            if line["event"] not in ("start", "stop") or not isinstance(line["fault"], str):
                raise HistoryError(f"{where}: bad fault event {line!r}")
    except HistoryError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise HistoryError(f"{path}: bad fault line ({exc!r})") from None
    open_at: dict[tuple[str, str], int] = {}
    windows: list[FaultWindow] = []
    for t, _, line in events:
        name = (str(line["fault"]), str(line.get("target", "")))
        if line["event"] == "start":
            open_at.setdefault(name, t)
        elif name in open_at:
            windows.append(FaultWindow(*name, open_at.pop(name), t))
    windows += [FaultWindow(*name, t, None) for name, t in open_at.items()]
    return sorted(windows, key=lambda w: w.start_t)


def _reordered(final: list[Read], sends: dict[str, Send], acked: set[str]) -> list[str]:
    """Acknowledged ordered messages stored after a higher seq of their key, per queue."""
    by_queue: dict[tuple[str, str], list[Read]] = defaultdict(list)
    for read in final:
        by_queue[(read.topic, read.queue)].append(read)
    reordered: list[str] = []
    for reads in by_queue.values():
        highest: dict[str, int] = {}
        seen: set[str] = set()
        for read in sorted(reads, key=lambda r: r.offset):
            send = sends.get(read.id)
            # A second copy is a duplicate (counted there), not an inversion.
            if send is None or not send.ordered or read.id in seen:
                continue
            seen.add(read.id)
            if read.id in acked and send.seq < highest.get(send.key, -1):
                reordered.append(read.id)
            highest[send.key] = max(send.seq, highest.get(send.key, -1))
    return sorted(reordered)


def _phantoms(history: History, readable: Counter[str]) -> list[str]:
    sent = {i for i, s in history.sends.items() if s.outcome != "fail"}
    received = [r for reads in history.receives.values() for r in reads]
    # invalid reads are counted below, by position when the body names no id
    phantom = {r.id for r in history.final + received if r.valid and r.id not in sent}
    phantom |= {
        r.id or f"{r.topic} {r.queue}@{r.offset}"
        for r in history.final
        if not r.valid and not r.refused
    }
    phantom |= {r.id or f"{r.queue}@{r.offset}" for r in received if not r.valid}
    phantom |= {r.id for r in received if r.id not in readable}
    return sorted(phantom)


def unavailable_s(sends: list[Send]) -> float:
    """Sum of the gaps over :data:`UNAVAILABLE_GAP_S` between acknowledgements, from the
    first send invoked to the last."""
    if not sends:
        return 0.0
    first = min(s.invoked_t for s in sends)
    last = max(s.invoked_t for s in sends)
    acks = sorted(s.done_t for s in sends if s.outcome == "ok" and first <= s.done_t <= last)
    points = [first, *acks, last]
    gaps = (b - a for a, b in pairwise(points))
    return round(sum(g for g in gaps if g > UNAVAILABLE_GAP_S * NS_PER_S) / NS_PER_S, 3)


def failover_s(sends: list[Send], faults: list[FaultWindow]) -> float:
    """The longest wait, over fault starts within the workload, for the first
    acknowledgement of a send invoked after the start."""
    if not sends:
        return 0.0
    last = max(s.invoked_t for s in sends)
    acks = sorted((s.invoked_t, s.done_t) for s in sends if s.outcome == "ok")
    worst = 0
    for window in faults:
        # A fault started after the last send (during the drain) waits less than 0: no count.
        after = [done for invoked, done in acks if invoked >= window.start_t]
        worst = max(worst, (min(after) if after else last) - window.start_t)
    return round(worst / NS_PER_S, 3)


def timeline(run_dir: Path) -> Timeline:
    """Acknowledgements per second and p50/p99 send latency (invoke to ok) per second, by
    the second of the acknowledgement, and the fault windows, in seconds from the first send."""
    history = load_history(run_dir)
    sends = list(history.sends.values())
    start = min((s.invoked_t for s in sends), default=0)
    latencies: dict[int, list[float]] = defaultdict(list)
    for s in sends:
        if s.outcome == "ok":
            latencies[(s.done_t - start) // NS_PER_S].append((s.done_t - s.invoked_t) / NS_PER_S)
    last_invoked = max((s.invoked_t - start) // NS_PER_S for s in sends) if sends else -1
    # Seconds without an ack up to the last send are zeros on the plot, not left out.
    seconds = range(max(*latencies, last_invoked, -1) + 1)
    for second in seconds:
        latencies[second].sort()

    def latency_ms(q: float) -> list[tuple[float, float]]:
        # nan where nothing was acknowledged: a gap in the line, not a latency of 0
        return [
            (float(i), percentile_ms(latencies[i], q) if latencies[i] else nan) for i in seconds
        ]

    return Timeline(
        acks_per_s=[(float(i), float(len(latencies[i]))) for i in seconds],
        p50_ms=latency_ms(0.5),
        p99_ms=latency_ms(0.99),
        faults=[
            (
                (w.start_t - start) / NS_PER_S,
                None if w.stop_t is None else (w.stop_t - start) / NS_PER_S,
                f"{w.fault} {w.target}".strip(),
            )
            for w in history.faults
        ],
    )


def _divergent(run_dir: Path) -> list[str]:
    path = run_dir / "members.json"
    if not path.exists():
        return []
    try:
        groups = json.loads(path.read_text(encoding="utf-8"))["groups"]
        found = []
        for group, state in sorted(groups.items()):
            logs = {member: run_dir / log for member, log in state["logs"].items()}
            at = first_divergence(logs, int(state["committed"]))
            if at is not None:
                found.append(f"{group}@{at}")
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise HistoryError(f"{path}: not a members file ({exc!r})") from None
    return found


@dataclass(frozen=True)
class _Segment:
    start: int
    path: Path
    size: int


def _segments(log_dir: Path) -> list[_Segment]:
    """The commit log's segment files, named by their start offset, in offset order."""
    if not log_dir.is_dir():
        return []
    return sorted(
        (_Segment(int(p.name), p, p.stat().st_size) for p in log_dir.iterdir() if _is_segment(p)),
        key=lambda s: s.start,
    )


def _is_segment(path: Path) -> bool:
    return path.name.isdigit() and len(path.name) == SEGMENT_NAME_DIGITS


def _held(segments: list[_Segment]) -> tuple[int, int]:
    """The offsets [start, end) a member holds without a gap, from its first segment."""
    if not segments:
        return 0, 0
    end = segments[0].start
    for seg in segments:
        if seg.start != end:
            break  # a hole: bytes after it are not a prefix of anything
        end += seg.size
    return segments[0].start, end


def _read_range(segments: list[_Segment], offset: int, end: int) -> bytes:
    pieces = []
    for seg in segments:
        lo, hi = max(offset, seg.start), min(end, seg.start + seg.size)
        if lo < hi:
            with seg.path.open("rb") as file:
                file.seek(lo - seg.start)
                pieces.append(file.read(hi - lo))
    return b"".join(pieces)


def first_divergence(logs: dict[str, Path], committed: int) -> int | None:
    """The first commit-log offset below ``committed`` where the members' logs differ or a
    member holds nothing; ``None`` when every member holds the same committed prefix.

    Segment files are read by the offsets their names give. Bytes below the newest first
    segment of the members are not compared: retention may have removed them on one member.
    """
    segments = {member: _segments(Path(log)) for member, log in logs.items()}
    held = {member: _held(segs) for member, segs in segments.items()}
    start = max((lo for lo, _ in held.values()), default=0)
    short = min((hi for _, hi in held.values()), default=committed)
    limit = min(committed, short)
    members = sorted(segments)
    offset = start
    while offset < limit:
        end = min(offset + COMPARE_CHUNK_BYTES, limit)
        chunks = [_read_range(segments[m], offset, end) for m in members]
        if any(chunk != chunks[0] for chunk in chunks):
            return offset + min(_first_difference(chunks[0], chunk) for chunk in chunks[1:])
        offset = end
    return short if short < committed else None


def _first_difference(a: bytes, b: bytes) -> int:
    if a == b:
        return len(a)
    return next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
