"""Safety checkers, fed by the world as things happen; each raises `SafetyViolation`.

They check Raft's guarantees (Figure 3 of the paper): election safety, log matching,
leader completeness, and state-machine safety, plus that acknowledged proposals survive.
"""

from __future__ import annotations

from hamq.raft.log import Entry, EntryId
from hamq.raft.node import RawNode


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
                raise SafetyViolation(f"leader {node_id} of term {node.term} lacks committed "
                                      f"entry {index} (term {entry.term})")

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
