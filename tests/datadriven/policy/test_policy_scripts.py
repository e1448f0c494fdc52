"""Data-driven tests of the placement reconciler: each `*.txt` script here builds a world
(nodes, policies, declared topics), asks `reconcile` for its plan and carries the steps out
the way the placement driver would, in the format of ../test_datadriven.py (`command
args`, `----`, expected output; REWRITE=1 regenerates the outputs — read the diff).

The simulated driver is deliberately plain: a new member joins unsynchronised (the first
member of an empty group becomes its master), an election succeeds only onto an alive
synchronised member, and syncing, draining and the controller's failover election are
script commands, so a script shows each wait the reconciler must respect.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from datadriven.test_datadriven import Command, parse_script, render
from hamq.policy.definition import DEFAULT_VHOST, Policy, PolicyError, make_policy
from hamq.policy.placement import (
    AddMember,
    DropTopic,
    ElectMaster,
    GroupView,
    MemberView,
    NodeView,
    PlaceTopic,
    RemoveMember,
    RetireTopic,
    Step,
    TopicDecl,
    World,
    reconcile,
)

SCRIPT_DIR = Path(__file__).parent
SETTLE_ROUNDS_MAX = 20  # a script that needs more is stuck in a loop


def describe_step(step: Step) -> str:
    fields = " ".join(str(v) for v in dataclasses.astuple(step))
    return f"{type(step).__name__} {fields}"


@dataclasses.dataclass
class SimGroup:
    members: dict[int, MemberView] = dataclasses.field(default_factory=dict)
    master_id: int | None = None
    next_id: int = 1

    def view(self, name: str) -> GroupView:
        return GroupView(name, tuple(self.members.values()), self.master_id)


@dataclasses.dataclass
class Harness:
    nodes: dict[str, bool] = dataclasses.field(default_factory=dict)
    policies: dict[tuple[str, str], Policy] = dataclasses.field(default_factory=dict)
    topics: dict[tuple[str, str], TopicDecl] = dataclasses.field(default_factory=dict)
    groups: dict[str, SimGroup] = dataclasses.field(default_factory=dict)
    retired: set[tuple[str, str, str]] = dataclasses.field(default_factory=set)
    drained: set[tuple[str, str, str]] = dataclasses.field(default_factory=set)
    locator: str = "client-local"
    out: list[str] = dataclasses.field(default_factory=list)

    def run(self, cmd: Command) -> str:
        self.out = []
        try:
            getattr(self, "cmd_" + cmd.name.replace("-", "_"))(cmd)
        except PolicyError as exc:
            self.out.append(f"error: {exc}")
        return "\n".join(self.out) if self.out else "ok"

    def world(self) -> World:
        return World(
            policies=tuple(self.policies.values()),
            topics=tuple(self.topics.values()),
            nodes=tuple(NodeView(n, alive) for n, alive in self.nodes.items()),
            groups=tuple(g.view(name) for name, g in self.groups.items() if g.members),
            drained=frozenset(self.drained),
            default_locator=self.locator,
        )

    # ---- the world ----

    def cmd_nodes(self, cmd: Command) -> None:
        for name in cmd.args:
            self.nodes[name] = True

    def _set_alive(self, names: list[str], alive: bool) -> None:
        for name in names:
            self.nodes[name] = alive
            for group in self.groups.values():
                for bid, m in group.members.items():
                    if m.node == name:
                        group.members[bid] = dataclasses.replace(m, alive=alive)

    def cmd_down(self, cmd: Command) -> None:
        self._set_alive(cmd.args, False)

    def cmd_up(self, cmd: Command) -> None:
        self._set_alive(cmd.args, True)

    def cmd_crash(self, cmd: Command) -> None:
        """`crash GROUP NODE`: that member's process is down, its node is not."""
        for group in self._named(cmd.args[0]):
            for bid, m in group.members.items():
                if m.node == cmd.args[1]:
                    group.members[bid] = dataclasses.replace(m, alive=False)

    def cmd_default_locator(self, cmd: Command) -> None:
        self.locator = cmd.args[0]

    def cmd_policy(self, cmd: Command) -> None:
        """`policy NAME PATTERN def=JSON [priority=N] [vhost=V] [apply_to=A]`"""
        vhost = cmd.kwargs.get("vhost", DEFAULT_VHOST)
        policy = make_policy(
            vhost,
            cmd.args[0],
            cmd.args[1],
            json.loads(cmd.kwargs["def"]),
            priority=int(cmd.kwargs.get("priority", "0")),
            apply_to=cmd.kwargs.get("apply_to", "topics"),
        )
        self.policies[(vhost, policy.name)] = policy

    def cmd_clear_policy(self, cmd: Command) -> None:
        del self.policies[(cmd.kwargs.get("vhost", DEFAULT_VHOST), cmd.args[0])]

    def cmd_declare(self, cmd: Command) -> None:
        """`declare TOPIC home=NODE [vhost=V] [exclusive=true] [queues=N]`"""
        vhost = cmd.kwargs.get("vhost", DEFAULT_VHOST)
        for name in cmd.args:
            self.topics[(vhost, name)] = TopicDecl(
                vhost,
                name,
                cmd.kwargs["home"],
                exclusive=cmd.kwargs.get("exclusive") == "true",
                queue_nums=int(cmd.kwargs.get("queues", "4")),
            )

    def cmd_sync(self, cmd: Command) -> None:
        """`sync GROUP [NODE ...]`: those members (all alive ones) caught up and synchronised."""
        for group in self._named(cmd.args[0]):
            for bid, m in group.members.items():
                if m.alive and (len(cmd.args) == 1 or m.node in cmd.args[1:]):
                    group.members[bid] = dataclasses.replace(m, synchronised=True)

    def cmd_elect(self, cmd: Command) -> None:
        """`elect GROUP NODE`: the controller's failover election onto that member."""
        for group in self._named(cmd.args[0]):
            group.master_id = next(bid for bid, m in group.members.items() if m.node == cmd.args[1])

    def cmd_drain(self, cmd: Command) -> None:
        """`drain`: every retired placement has been consumed."""
        self.drained |= self.retired

    def _named(self, prefix: str) -> list[SimGroup]:
        found = [g for name, g in self.groups.items() if name.startswith(prefix)]
        assert len(found) == 1, f"{prefix!r} names {len(found)} groups"
        return found

    # ---- the reconciler and the simulated driver ----

    def cmd_plan(self, cmd: Command) -> None:
        plan = reconcile(self.world())
        for name, g in sorted(plan.groups.items()):
            policy = f"{g.policy[1]}@{g.policy[0]}" if g.policy else "-"
            self.out.append(
                f"group {name} policy={policy} nodes={','.join(g.nodes)} master={g.master_node}"
            )
        for (vhost, topic), group in sorted(plan.topic_group.items()):
            self.out.append(f"topic {vhost} {topic} -> {group}")
        self.out.extend(describe_step(s) for s in plan.steps)

    def cmd_step(self, cmd: Command) -> None:
        """One round: reconcile, print the steps and carry them out."""
        steps = reconcile(self.world()).steps
        self.out.extend(describe_step(s) for s in steps)
        for step in steps:
            self.apply(step)

    def cmd_settle(self, cmd: Command) -> None:
        """Rounds until nothing is left to do; between rounds every alive member catches
        up and every retired placement drains (nodes stay as they are)."""
        for round_no in range(1, SETTLE_ROUNDS_MAX + 1):
            steps = reconcile(self.world()).steps
            if not steps:
                self.out.append(f"settled after {round_no - 1} rounds")
                return
            self.out.append(f"round {round_no}:")
            self.out.extend("  " + describe_step(s) for s in steps)
            for step in steps:
                self.apply(step)
            self.catch_up()
        raise AssertionError("settle did not settle")

    def catch_up(self) -> None:
        """Every alive member synchronised, every retired placement drained."""
        for group in self.groups.values():
            for bid, m in group.members.items():
                if m.alive:
                    group.members[bid] = dataclasses.replace(m, synchronised=True)
        self.drained |= self.retired

    def apply(self, step: Step) -> None:
        if isinstance(step, AddMember):
            group = self.groups.setdefault(step.group, SimGroup())
            if any(m.node == step.node for m in group.members.values()):
                return
            first = not group.members
            bid = group.next_id
            group.next_id += 1
            group.members[bid] = MemberView(bid, step.node, self.nodes[step.node], first)
            if first:
                group.master_id = bid
        elif isinstance(step, ElectMaster):
            group = self.groups[step.group]
            member = group.members[step.broker_id]
            assert member.alive and member.synchronised, f"elect onto {member}"
            group.master_id = step.broker_id
        elif isinstance(step, RemoveMember):
            group = self.groups[step.group]
            assert step.broker_id != group.master_id or len(group.members) == 1, step
            group.members.pop(step.broker_id, None)
            if step.broker_id == group.master_id:
                group.master_id = None
        elif isinstance(step, PlaceTopic):
            key = (step.vhost, step.topic)
            topic = self.topics[key]
            held = (*(g for g in topic.groups if g != step.group), step.group)
            self.topics[key] = dataclasses.replace(topic, groups=held)
            self.retired.discard((step.vhost, step.topic, step.group))
        elif isinstance(step, RetireTopic):
            self.retired.add((step.vhost, step.topic, step.group))
        else:
            assert isinstance(step, DropTopic)
            key = (step.vhost, step.topic)
            topic = self.topics[key]
            held = tuple(g for g in topic.groups if g != step.group)
            self.topics[key] = dataclasses.replace(topic, groups=held)
            self.retired.discard((step.vhost, step.topic, step.group))
            self.drained.discard((step.vhost, step.topic, step.group))

    def cmd_show(self, cmd: Command) -> None:
        for name, group in sorted(self.groups.items()):
            members = " ".join(
                f"{m.broker_id}:{m.node}"
                + ("*" if bid == group.master_id else "")
                + ("" if m.alive else "(down)")
                + ("" if m.synchronised else "(unsync)")
                for bid, m in sorted(group.members.items())
            )
            self.out.append(f"{name}: {members or 'empty'}")
        for (vhost, topic), decl in sorted(self.topics.items()):
            self.out.append(f"{vhost} {topic}: {' '.join(decl.groups) or '-'}")


SCRIPTS = sorted(SCRIPT_DIR.glob("*.txt"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_script(script: Path) -> None:
    harness = Harness()
    blocks = parse_script(script)
    rewrite = os.environ.get("REWRITE") == "1"
    for block in blocks:
        actual = harness.run(block.command).splitlines()
        if actual != block.expected:
            if not rewrite:
                pytest.fail(
                    f"{script.name}:{block.command.line}: {block.command_line}\nexpected:\n"
                    + "\n".join(block.expected)
                    + "\nactual:\n"
                    + "\n".join(actual)
                )
            block.expected = actual
    if rewrite:
        script.write_text(render(blocks))
