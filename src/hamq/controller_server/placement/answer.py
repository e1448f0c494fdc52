"""CONTROLLER_GET_PLACEMENT's answer, apart from the driver that keeps the plan: the
answer is wire format (msgpack-ready dicts), the plan is the reconciler's."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hamq.controller_server.placement.rounds import Step
from hamq.policy import placement as policy


def describe(step: Step) -> str:
    fields = ", ".join(f"{k}={v!r}" for k, v in vars(step).items())
    return f"{type(step).__name__}({fields})"


def placement_ext(plan: policy.Plan | None, in_flight: Iterable[str]) -> dict[str, Any]:
    """CONTROLLER_GET_PLACEMENT's answer: the last plan and its pending steps."""
    if plan is None:
        return {"groups": [], "topics": [], "pending": [], "in_flight": []}
    return {
        "groups": [
            {
                "name": g.name,
                "policy": list(g.policy) if g.policy is not None else None,
                "nodes": list(g.nodes),
                "master_node": g.master_node,
            }
            for g in sorted(plan.groups.values(), key=lambda g: g.name)
        ],
        "topics": [
            {"vhost": vhost, "topic": topic, "group": group}
            for (vhost, topic), group in sorted(plan.topic_group.items())
        ],
        "pending": [describe(step) for step in plan.steps],
        "in_flight": sorted(in_flight),
    }
