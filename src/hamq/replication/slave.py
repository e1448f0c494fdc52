"""The slave's side of the master–slave handshake, sans-IO: find the last offset where this
slave's log agrees with its master's, so it never keeps (serves, acknowledges) bytes that
differ from the master's at the same offsets.

A master with async flush can lose an unfsynced tail its slave already holds, and then
write other records at those offsets; a slave can also be ahead of a master that lost its
disk. So the slave first offers to attach at its log end, proven by its last record
(``AttachRequest``). If the master does not hold that record identically, the two bisect
over the slave's record boundaries: each round the slave sends up to ``MAX_PROBES``
records spread over the range still in doubt (``CompareRequest``) and the master says which
it holds. Records agree up to some point and differ after it (a record rewritten after a
loss has a later store time), so the range shrinks until no record is left in doubt; the
slave then attaches at the end of the last agreeing record, cuts what follows, and the
master ships from there. Time and I/O stay outside: the slave's log is read through a
``RecordLog``; requests and replies are values the shell puts on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass

from hamq.replication.master import MAX_PROBES, HandshakeError, Probe, RecordLog


@dataclass(frozen=True)
class AttachRequest:
    offset: int  # where this slave's log agrees with the master's, it claims
    proof: Probe | None  # its record ending at ``offset``; None: ``offset`` is its log start

    def to_wire(self) -> dict[str, object]:
        return {
            "attach": self.offset,
            "proof": self.proof.to_wire() if self.proof is not None else None,
        }


@dataclass(frozen=True)
class CompareRequest:
    probes: tuple[Probe, ...]  # ascending offsets

    def to_wire(self) -> dict[str, object]:
        return {"probes": [p.to_wire() for p in self.probes]}


HandshakeRequest = AttachRequest | CompareRequest


@dataclass(frozen=True)
class Attached:
    """The handshake's outcome: cut the log back to ``agreed`` (or restart it empty at
    ``start`` when the master keeps nothing that old) and receive from ``start``."""

    agreed: int
    start: int


def parse_request(ext: dict[str, object]) -> HandshakeRequest:
    """A handshake request off the wire (master side); ``HandshakeError`` if malformed."""
    if "probes" in ext:
        raw = ext["probes"]
        if not isinstance(raw, list) or len(raw) > MAX_PROBES:
            raise HandshakeError(f"probes must be a list of at most {MAX_PROBES} records")
        return CompareRequest(tuple(Probe.from_wire(p) for p in raw))
    offset = ext.get("attach")
    if type(offset) is not int or offset < 0:
        raise HandshakeError(
            "a handshake names the offset to attach at ('attach') or the "
            "records to compare ('probes'); this slave may be too old"
        )
    proof = ext.get("proof")
    return AttachRequest(offset, Probe.from_wire(proof) if proof is not None else None)


class SlaveHandshake:
    """One handshake: ``first()``, then ``on_attach_reply`` / ``on_compare_reply`` with the
    master's answers until one returns ``Attached``."""

    def __init__(self, log: RecordLog) -> None:
        self.log = log
        # Everything before ``lo`` agrees (``lo_proof`` is the record ending there, None at
        # the log start); the record starting at ``hi`` (if any) does not.
        self.lo = log.min_offset
        self.lo_proof: Probe | None = None
        self.hi = log.max_offset
        self._asked: HandshakeRequest | None = None

    def first(self) -> HandshakeRequest:
        last = self.log.last_record_start()
        proof = self.log.probe(last) if last is not None else None
        if last is not None and proof is None:  # unreadable last record: look further back
            self.hi = last
            return self._next()
        return self._ask(AttachRequest(proof.end if proof else self.lo, proof))

    def on_attach_reply(self, start: int | None) -> HandshakeRequest | Attached:
        asked = self._asked
        if not isinstance(asked, AttachRequest):
            raise HandshakeError("an attach reply to a request that was not an attach")
        if start is not None:
            return Attached(asked.offset, start)
        if asked.proof is None:
            raise HandshakeError("the master refused an attach at this slave's log start")
        # The master lacks this record: it and everything after it are in doubt no more.
        self.hi = asked.proof.offset
        if asked.proof is self.lo_proof:  # the master's log changed under us: start over
            self.lo, self.lo_proof = self.log.min_offset, None
        return self._next()

    def on_compare_reply(self, matches: list[bool]) -> HandshakeRequest:
        asked = self._asked
        if not isinstance(asked, CompareRequest) or len(matches) != len(asked.probes):
            raise HandshakeError("a compare reply that does not answer the probes sent")
        agreeing = 0
        while agreeing < len(matches) and matches[agreeing] is True:
            agreeing += 1
        if agreeing:
            self.lo_proof = asked.probes[agreeing - 1]
            self.lo = self.lo_proof.end
        if agreeing < len(matches):
            self.hi = asked.probes[agreeing].offset
        return self._next()

    def _next(self) -> HandshakeRequest:
        starts = self.log.record_starts(self.lo, self.hi)
        if not starts:
            return self._ask(AttachRequest(self.lo, self.lo_proof))
        n = len(starts)
        picks = (
            range(n)
            if n <= MAX_PROBES
            else sorted({i * n // MAX_PROBES for i in range(MAX_PROBES)})
        )
        probes = []
        for i in picks:
            probe = self.log.probe(starts[i])
            if probe is None:  # unreadable here: nothing from it on can be vouched for
                self.hi = starts[i]
                break
            probes.append(probe)
        if not probes:
            return self._next()
        return self._ask(CompareRequest(tuple(probes)))

    def _ask(self, request: HandshakeRequest) -> HandshakeRequest:
        self._asked = request
        return request
