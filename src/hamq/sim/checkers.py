"""Safety checkers, fed by the world as things happen; each raises `SafetyViolation`.

They check Raft's guarantees (Figure 3 of the paper): election safety, log matching,
leader completeness, and state-machine safety, plus that acknowledged proposals survive;
and at the level of the message stores the members apply to: identical commit logs and
queues, acknowledged sends readable where their answer put them, and restarts that resume
from what the store claimed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hamq.broker.dledger.core import Recovery
from hamq.protocol.message import decode_records, offset_msg_id
from hamq.raft.log import EMPTY_INDEX, Entry, EntryId
from hamq.raft.node import RawNode
from hamq.store.message_store import MessageStore


class SafetyViolation(AssertionError):
    """A broken Raft guarantee: a bug in the core (or in the simulator)."""


class Checkers:
    def __init__(self) -> None:
        self.leaders_by_term: dict[int, int] = {}
        # (index, term) -> (data, is_noop, term before it): by induction, equal keys on
        # two logs then mean equal prefixes (log matching)
        self._written: dict[tuple[int, int], tuple[bytes, bool, int]] = {}
        self.committed: dict[int, Entry] = {}  # every entry any member applied
        self.acknowledged: list[EntryId] = []

    def on_leader(self, node_id: int, node: RawNode) -> None:
        """Called for every member that leads after an event."""
        leader = self.leaders_by_term.setdefault(node.term, node_id)
        if leader != node_id:
            raise SafetyViolation(f"term {node.term} has two leaders: {leader} and {node_id}")

    def on_elected(self, node_id: int, node: RawNode) -> None:
        for index, entry in self.committed.items():
            if entry.term < node.term and not node.log.matches(index, entry.term):
                raise SafetyViolation(
                    f"leader {node_id} of term {node.term} lacks committed "
                    f"entry {index} (term {entry.term})"
                )

    def on_persist(self, node_id: int, node: RawNode, entries: list[Entry]) -> None:
        for entry in entries:
            key = (entry.index, entry.term)
            value = (entry.data, entry.is_noop, node.log.term(entry.index - 1))
            seen = self._written.setdefault(key, value)
            if seen != value:
                raise SafetyViolation(f"node {node_id} holds {key} as {value}, seen {seen}")

    def on_apply(self, node_id: int, applied_index: int, entries: list[Entry]) -> int:
        """Check applied entries continue the member's sequence and agree with everyone's."""
        for entry in entries:
            if entry.index != applied_index + 1:
                raise SafetyViolation(f"node {node_id} applied {entry.index} after {applied_index}")
            applied_index = entry.index
            seen = self.committed.setdefault(entry.index, entry)
            if seen != entry:
                raise SafetyViolation(f"node {node_id} applied {entry} where {seen} was applied")
        return applied_index

    def check_final(self, node_id: int, node: RawNode) -> None:
        """The surviving leader holds every applied entry and every acknowledged proposal."""
        self.on_elected(node_id, node)
        for index, entry in self.committed.items():
            if not node.log.matches(index, entry.term):
                raise SafetyViolation(f"committed entry {index} lost by final leader {node_id}")
        for entry_id in self.acknowledged:
            if not node.log.matches(entry_id.index, entry_id.term):
                raise SafetyViolation(f"acknowledged proposal {entry_id} lost")


# ---- the message stores the members apply to ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Ack:
    """A send a client was told succeeded, and where it was told it sits."""

    topic: str
    queue_id: int
    body: bytes
    physical_offset: int  # the msg id is derived from it
    queue_offset: int


def check_restart(
    node_id: int, claim: int | None, recovery: Recovery, applied_at_clean_stop: int | None
) -> None:
    """A restarted member resumes from the applied index its store checkpoint claimed
    (re-applying only what followed, which a crash may have lost); after a clean stop it
    re-applies nothing at all."""
    expected = EMPTY_INDEX if claim is None else claim
    if recovery.applied_index != expected:
        raise SafetyViolation(
            f"node {node_id} restarted from applied index "
            f"{recovery.applied_index}, its store claimed {expected}"
        )
    if applied_at_clean_stop is not None and (
        recovery.cut_bytes or recovery.applied_index != applied_at_clean_stop
    ):
        raise SafetyViolation(
            f"node {node_id} re-applies after a clean stop: applied {applied_at_clean_stop} "
            f"when stopped, resumes from {recovery.applied_index}, {recovery.cut_bytes} "
            "bytes cut"
        )


def check_stores(
    stores: dict[int, MessageStore], leader_id: int, acks: list[Ack], caught_up: set[int]
) -> None:
    """Members' commit logs are prefixes of one another, byte for byte; members that
    applied as far as the leader have the same queues (a member behind may still hold a
    topic the others deleted); every acknowledged send is where its answer said, on every
    member that holds that far (the final leader holds it all)."""
    for key in sorted({key for store in stores.values() for key in store.queues}):
        queues = {}
        for i in sorted(caught_up):
            store = stores[i]
            cq = store.queues.get(key)
            queues[i] = [] if cq is None else list(zip(cq.phys, cq.size, cq.base, cq.count))
        _check_prefixes(f"queue {key}", queues)
    logs = {
        i: bytes(s.commitlog.read_range(s.commitlog.min_offset, s.commitlog.written_offset))
        for i, s in stores.items()
    }
    _check_prefixes("commit log", logs)
    for ack in acks:
        for i, store in stores.items():
            if i == leader_id or store.commitlog.written_offset > ack.physical_offset:
                _check_ack(i, store, ack)


def _check_prefixes(what: str, contents: dict[int, bytes | list]) -> None:
    ordered = sorted(contents.items(), key=lambda item: len(item[1]))
    for (a, shorter), (b, longer) in itertools.pairwise(ordered):
        if longer[: len(shorter)] != shorter:
            raise SafetyViolation(
                f"{what} of nodes {a} and {b} differ within their common "
                f"prefix ({len(shorter)} long)"
            )


def _check_ack(node_id: int, store: MessageStore, ack: Ack) -> None:
    got = store.get_messages(ack.topic, ack.queue_id, ack.queue_offset, 1, 1 << 20)
    found = decode_records(
        got.records,
        ack.queue_offset,
        lambda h, index, off, props, body: (h.physical_offset, off, body),
    )
    if (ack.physical_offset, ack.queue_offset, ack.body) not in found:
        raise SafetyViolation(
            f"node {node_id} lost acknowledged send {ack.body!r} "
            f"({ack.topic}/{ack.queue_id}@{ack.queue_offset}, msg id "
            f"{offset_msg_id(ack.physical_offset, 0)}): holds {found}"
        )
