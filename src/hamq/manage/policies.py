"""Policies as the controller stores them, read back into checked ``Policy`` values, and
set after the same checks the controller makes (a typo is refused before anything is
sent, naming the key)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from hamq.client.admin import AsyncControllerAdmin
from hamq.policy.definition import Policy, make_policy


def policy_of(row: Mapping[str, Any]) -> Policy:
    """A policy as the controller lists it (the definition as JSON text or a map)."""
    definition = row["definition"]
    return make_policy(
        row["vhost"],
        row["name"],
        row["pattern"],
        json.loads(definition) if isinstance(definition, str) else definition,
        priority=row["priority"],
        apply_to=row["apply_to"],
    )


async def find_policy(controllers: AsyncControllerAdmin, vhost: str, name: str) -> Policy | None:
    """The policy ``name`` of ``vhost``, or None."""
    for row in await controllers.client.list_policies(vhost):
        if row["name"] == name:
            return policy_of(row)
    return None


async def set_policy(controllers: AsyncControllerAdmin, policy: Policy) -> dict[str, Any]:
    """Store a checked policy (create or replace); the row as the controller lists it."""
    definition = policy.definition.to_json()
    await controllers.client.set_policy(
        policy.vhost, policy.name, policy.pattern, definition, policy.priority, policy.apply_to
    )
    return {
        "vhost": policy.vhost,
        "name": policy.name,
        "pattern": policy.pattern,
        "definition": definition,
        "priority": policy.priority,
        "apply_to": policy.apply_to,
    }
