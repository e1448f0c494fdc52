"""Which steps of a plan a round carries out: one task per group, membership before
topics, so a group's plan is never acted on past the point where it went stale."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hamq.policy import placement as policy

MEMBERSHIP_STEPS = (policy.AddMember, policy.ElectMaster, policy.RemoveMember)


@dataclass(frozen=True)
class CollectTopics:
    """The topics a managed group's master holds that the state does not account for,
    read and settled in the group's own task, after its placements of the round (the
    group's topics change only there). Undeclared ones were deleted through the
    controller (DELETE_TOPIC, DELETE_VHOST, an exclusive topic whose connection closed),
    which changes only the replicated state: they leave the group. A declared topic the
    group holds without the state listing it there was placed by a PlaceTopic whose
    SetTopicGroups never committed: recorded as held (not writable), it is then retired,
    drained and dropped like any old placement, or placed again if it is the target. A
    topic whose writable group it is but whose master lacks it read-write (a deposed
    leader's delete or retirement landed after the move back) is made writable again."""

    group: str


Step = policy.Step | CollectTopics


def step_group(step: Step) -> str:
    return step.group


def round_steps(
    steps: Iterable[Step], busy: Iterable[str], unplaced: frozenset[str]
) -> dict[str, tuple[Step, ...]]:
    """What this round carries out, per group not busy: its first membership step (the
    plan after it is stale until observed), unless the group has a member not placed on a
    node yet, then its topic steps (idempotent updates, in plan order)."""
    taken: dict[str, list[Step]] = {}
    skip = set(busy)
    for step in steps:
        group = step_group(step)
        if group in skip:
            continue
        todo = taken.setdefault(group, [])
        if isinstance(step, MEMBERSHIP_STEPS):
            if group in unplaced or any(isinstance(s, MEMBERSHIP_STEPS) for s in todo):
                continue
            todo.insert(0, step)
        else:
            todo.append(step)
    return {group: tuple(todo) for group, todo in taken.items() if todo}
