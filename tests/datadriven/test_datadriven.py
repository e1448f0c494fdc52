"""etcd-style data-driven tests of the Raft core: each `*.txt` script is a list of

    command args
    ----
    expected output

blocks; `#` lines are comments. REWRITE=1 regenerates the expected outputs in place
(read the diff: the new output must be right, not just new).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hamq.raft import (
    Entry,
    MemoryStorage,
    Message,
    MessageType,
    RaftConfig,
    RaftError,
    RawNode,
    Ready,
    ResponseCode,
    quorum_index,
)
from hamq.raft.config import MAX_ENTRIES_PER_PUSH
from hamq.raft.storage import persist

SCRIPT_DIR = Path(__file__).parent
SEPARATOR = "----"
TICK_MS = 10
STABILIZE_ROUNDS_MAX = 100  # a script that needs more is stuck in a loop


class MaxJitter:
    """Election timeouts at the top of their range: a member campaigns only when a
    script ticks it twice the election timeout, never by accident."""

    def randrange(self, start: int, stop: int) -> int:
        return stop - 1


@dataclass
class Command:
    name: str
    args: list[str]
    kwargs: dict[str, str]
    line: int


@dataclass
class Block:
    comments: list[str]
    command_line: str
    command: Command
    expected: list[str]


def parse_script(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks, comments, i = [], [], 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("#"):
            comments.append(line)
            i += 1
            continue
        assert lines[i + 1] == SEPARATOR, f"{path}:{i + 2}: expected {SEPARATOR!r}"
        j = i + 2
        expected = []
        while j < len(lines) and lines[j].strip():
            expected.append(lines[j])
            j += 1
        blocks.append(Block(comments, line, parse_command(line, i + 1), expected))
        comments, i = [], j
    assert not [c for c in comments if c.strip()], f"{path}: trailing comments"
    return blocks


def parse_command(line: str, line_no: int) -> Command:
    tokens = re.findall(r"\S+=\([^)]*\)|\S+", line)
    args = [t for t in tokens[1:] if "=" not in t]
    kwargs = dict(t.split("=", 1) for t in tokens[1:] if "=" in t)
    return Command(tokens[0], args, kwargs, line_no)


def id_list(value: str) -> list[int]:
    return [int(x) for x in value.strip("()").split(",") if x.strip()]


def describe_entry(entry: Entry) -> str:
    data = "noop" if entry.is_noop else repr(entry.data.decode())
    return f"{entry.index}@{entry.term} {data}"


def describe_message(msg: Message) -> str:
    head = f"{msg.from_id}->{msg.to_id} {msg.type.name} term={msg.term}"
    t = msg.type
    if t in (MessageType.PRE_VOTE, MessageType.VOTE):
        tail = f" last={msg.index}@{msg.log_term}" + (" force" if msg.force else "")
    elif t in (MessageType.PRE_VOTE_RESPONSE, MessageType.VOTE_RESPONSE):
        tail = " granted" if msg.code == ResponseCode.SUCCESS else " rejected"
    elif t == MessageType.APPEND:
        entries = ", ".join(map(describe_entry, msg.entries))
        tail = (
            f" prev_term={msg.log_term} entries=[{entries}] commit={msg.committed_index}"
            f" water_mark={msg.water_mark}"
        )
    elif t == MessageType.TRUNCATE:
        tail = (
            f" prev_term={msg.log_term} entry={describe_entry(msg.entries[0])}"
            f" commit={msg.committed_index} next_term={msg.next_term}"
        )
    elif t == MessageType.COMPARE:
        tail = f" entry={describe_entry(msg.entries[0])}"
    elif t == MessageType.COMMIT:
        tail = f" commit={msg.committed_index} water_mark={msg.water_mark}"
    elif t == MessageType.PUSH_RESPONSE:
        assert msg.req_type is not None
        tail = (
            f" {msg.req_type.name}({msg.index}) {msg.code.name}"
            f" begin={msg.begin_index} end={msg.end_index}"
        )
    else:
        tail = ""
    return head + tail


@dataclass
class Harness:
    """Members with in-memory storage, a message queue, partitions and crashes."""

    nodes: dict[int, RawNode | None] = field(default_factory=dict)
    storages: dict[int, MemoryStorage] = field(default_factory=dict)
    configs: dict[int, RaftConfig] = field(default_factory=dict)
    clocks: dict[int, int] = field(default_factory=dict)
    applied: dict[int, int] = field(default_factory=dict)
    queue: list[Message] = field(default_factory=list)
    blocked: set[tuple[int, int]] = field(default_factory=set)
    out: list[str] = field(default_factory=list)

    def run(self, cmd: Command) -> str:
        self.out = []
        handler: Callable[[Command], None] = getattr(self, "cmd_" + cmd.name.replace("-", "_"))
        try:
            handler(cmd)
        except RaftError as exc:
            self.out.append(f"error: {type(exc).__name__}: {exc}")
        return "\n".join(self.out) if self.out else "ok"

    def node(self, node_id: int) -> RawNode:
        node = self.nodes[node_id]
        assert node is not None, f"node {node_id} is down"
        return node

    # ---- membership and faults ----

    def cmd_add_nodes(self, cmd: Command) -> None:
        count = int(cmd.args[0])
        ids = tuple(range(1, count + 1))
        pre_vote = cmd.kwargs.get("pre_vote", "true") == "true"
        per_push = int(cmd.kwargs.get("max_entries_per_push", MAX_ENTRIES_PER_PUSH))
        # off unless asked for: most scripts elect a new group's first leader in one step
        guard = cmd.kwargs.get("empty_disk_guard", "false") == "true"
        for node_id in ids:
            self.configs[node_id] = RaftConfig(
                node_id=node_id,
                member_ids=ids,
                pre_vote=pre_vote,
                max_entries_per_push=per_push,
                empty_disk_guard=guard,
            )
            self.storages[node_id] = MemoryStorage()
            self.clocks[node_id] = 0
            self._start(node_id)

    def _start(self, node_id: int) -> None:
        self.nodes[node_id] = RawNode(
            self.configs[node_id], self.storages[node_id], MaxJitter(), now_ms=self.clocks[node_id]
        )
        self.applied[node_id] = -1

    def cmd_crash(self, cmd: Command) -> None:
        """Everything handed over in a Ready is durable here, so a crash loses only
        the member's memory and the messages still queued for it. `lose_from=N` also
        drops its stored entries from index N on (a power loss took what async flush had
        left in the page cache, after the member acknowledged it); `wipe=true` loses its
        whole disk (a member rebuilt with an empty one)."""
        lose_from = cmd.kwargs.get("lose_from")
        wipe = cmd.kwargs.get("wipe") == "true"
        for node_id in map(int, cmd.args):
            self.nodes[node_id] = None
            self.queue = [m for m in self.queue if m.to_id != node_id]
            if wipe:
                self.storages[node_id] = MemoryStorage()
            elif lose_from is not None:
                self.storages[node_id].truncate_suffix(int(lose_from))

    def cmd_restart(self, cmd: Command) -> None:
        for node_id in map(int, cmd.args):
            self._start(node_id)

    def cmd_partition(self, cmd: Command) -> None:
        """`partition 1 2 / 3 4 5`: no message crosses between the groups; with
        `one_way=true` only messages from the first group to the others are lost."""
        one_way = cmd.kwargs.get("one_way") == "true"
        groups = " ".join(cmd.args).split("/")
        sides = [[int(x) for x in g.split()] for g in groups]
        for i, side in enumerate(sides):
            for other in sides[i + 1 :]:
                for a in side:
                    for b in other:
                        self.blocked.add((a, b))
                        if not one_way:
                            self.blocked.add((b, a))

    def cmd_heal(self, cmd: Command) -> None:
        self.blocked.clear()

    def cmd_tick(self, cmd: Command) -> None:
        """`tick ID N`: advance one member's clock by N ticks of TICK_MS."""
        node_id, count = int(cmd.args[0]), int(cmd.args[1])
        for _ in range(count):
            self.clocks[node_id] += TICK_MS
            self.node(node_id).tick(self.clocks[node_id])

    # ---- client and admin requests ----

    def cmd_campaign(self, cmd: Command) -> None:
        self.node(int(cmd.args[0])).campaign()

    def cmd_propose(self, cmd: Command) -> None:
        entry_id = self.node(int(cmd.args[0])).propose(cmd.args[1].encode())
        self.out.append(f"proposed {entry_id.index}@{entry_id.term}")

    def cmd_transfer_leadership(self, cmd: Command) -> None:
        self.node(int(cmd.kwargs["from"])).transfer_leadership(int(cmd.kwargs["to"]))

    # ---- I/O ----

    def cmd_process_ready(self, cmd: Command) -> None:
        for node_id in map(int, cmd.args):
            self._process_ready(node_id)

    def _process_ready(self, node_id: int) -> bool:
        node = self.nodes[node_id]
        if node is None or not node.has_ready():
            return False
        ready = node.ready()
        self._persist(node_id, ready)
        self.out.append(f"> {node_id} handling Ready")
        self.out.extend("  " + line for line in self._describe_ready(ready))
        self.queue.extend(ready.messages)
        if ready.committed_entries:
            self.applied[node_id] = ready.committed_entries[-1].index
        node.advance(ready)
        return True

    def _persist(self, node_id: int, ready: Ready) -> None:
        persist(self.storages[node_id], ready)

    @staticmethod
    def _describe_ready(ready: Ready) -> list[str]:
        lines = []
        if ready.hard_state is not None:
            lines.append(
                f"HardState term={ready.hard_state.term} vote={ready.hard_state.voted_for}"
            )
        if ready.entries:
            lines.append("Entries: " + ", ".join(describe_entry(e) for e in ready.entries))
        if ready.committed_entries:
            lines.append(
                "Committed: " + ", ".join(describe_entry(e) for e in ready.committed_entries)
            )
        lines.extend(f"Completed: {e.index}@{e.term}" for e in ready.completed_proposals)
        lines.extend(
            f"Failed: {f.entry_id.index}@{f.entry_id.term} {f.reason.name}"
            for f in ready.failed_proposals
        )
        lines.extend(describe_message(m) for m in ready.messages)
        return lines

    def cmd_deliver_msgs(self, cmd: Command) -> None:
        """`deliver-msgs [IDS] [drop=(FROM,...)] [type=T] [index=I]`: deliver the queued
        messages to IDS (default all) that match the filters; drop=(…) discards those
        sent by the listed members instead of delivering them."""
        self._deliver(self._select(cmd), id_list(cmd.kwargs.get("drop", "()")))

    def cmd_drop_msgs(self, cmd: Command) -> None:
        for msg in self._select(cmd):
            self.queue.remove(msg)
            self.out.append(f"dropped {describe_message(msg)}")

    def _select(self, cmd: Command) -> list[Message]:
        targets = set(map(int, cmd.args)) or set(self.nodes)
        mtype = cmd.kwargs.get("type")
        index = cmd.kwargs.get("index")
        return [
            m
            for m in self.queue
            if m.to_id in targets
            and (mtype is None or m.type.name == mtype)
            and (index is None or m.index == int(index))
        ]

    def _deliver(self, selected: list[Message], dropped_senders: list[int]) -> bool:
        for msg in selected:
            self.queue.remove(msg)
        for msg in selected:
            node = self.nodes[msg.to_id]
            if (
                node is None
                or (msg.from_id, msg.to_id) in self.blocked
                or msg.from_id in dropped_senders
            ):
                self.out.append(f"dropped {describe_message(msg)}")
                continue
            # messages cross the wire as bytes in production: exercise the codec here too
            node.step(Message.decode(msg.encode()))
        return bool(selected)

    def cmd_stabilize(self, cmd: Command) -> None:
        """Handle Readies and deliver messages until nothing moves."""
        for _ in range(STABILIZE_ROUNDS_MAX):
            progressed = False
            for node_id in sorted(self.nodes):
                progressed |= self._process_ready(node_id)
            if self.queue:
                self.out.append(
                    "> delivering "
                    + ", ".join(f"{m.from_id}->{m.to_id} {m.type.name}" for m in self.queue)
                )
                progressed |= self._deliver(list(self.queue), [])
            if not progressed:
                return
        raise AssertionError("stabilize did not settle")

    # ---- inspection ----

    def cmd_print_state(self, cmd: Command) -> None:
        for node_id, node in sorted(self.nodes.items()):
            if node is None:
                self.out.append(f"{node_id}: down")
                continue
            self.out.append(
                f"{node_id}: {node.role.name} term={node.term} lead={node.leader_id} "
                f"vote={node.voted_for} last={node.log.ledger_end_index} "
                f"commit={node.committed_index} applied={self.applied[node_id]}"
            )

    def cmd_log(self, cmd: Command) -> None:
        for node_id in map(int, cmd.args):
            entries = self.storages[node_id].entries_from(0)
            self.out.append(f"{node_id}: " + (", ".join(map(describe_entry, entries)) or "empty"))

    def cmd_dispatchers(self, cmd: Command) -> None:
        node = self.node(int(cmd.args[0]))
        for peer, d in sorted(node.dispatchers.items()):
            self.out.append(
                f"{peer}: {d.push_type.name} water_mark={node.water_mark(peer)} "
                f"write_index={d.write_index} compare_index={d.compare_index} "
                f"truncate_index={d.truncate_index} pending={sorted(d.pending_map)}"
            )

    def cmd_quorum_index(self, cmd: Command) -> None:
        """`quorum-index 1 1 2 3 3`: the index a majority of these watermarks reached."""
        self.out.append(str(quorum_index(int(x) for x in cmd.args)))


SCRIPTS = sorted(SCRIPT_DIR.glob("*.txt"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_script(script: Path) -> None:
    harness = Harness()
    blocks = parse_script(script)
    rewrite = os.environ.get("REWRITE") == "1"
    mismatches = []
    for block in blocks:
        actual = harness.run(block.command).splitlines()
        if actual != block.expected:
            if rewrite:
                block.expected = actual
            else:
                mismatches.append(
                    f"{script.name}:{block.command.line}: {block.command_line}\n"
                    f"expected:\n" + "\n".join(block.expected) + "\nactual:\n" + "\n".join(actual)
                )
                break  # later blocks depend on this one
    if rewrite:
        script.write_text(render(blocks))
    assert not mismatches, mismatches[0]


def render(blocks: list[Block]) -> str:
    parts: list[str] = []
    for block in blocks:
        if parts and (not block.comments or block.comments[0].strip()):
            parts.append("")  # an output block ends at a blank line
        parts.extend(block.comments)
        parts.extend([block.command_line, SEPARATOR, *block.expected])
    return "\n".join(parts) + "\n"
