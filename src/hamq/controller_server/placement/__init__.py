"""The placement driver (seed 003): on the serving controller leader, every
``placement_interval_ms``, the policies, declared topics and nodes of the replicated state,
with what the nodes and the members report, become a ``policy.placement.World``;
``reconcile`` turns it into a plan, and the driver carries the plan's steps out against
real containers and brokers.

Nothing the driver remembers decides anything: each round starts again from the
replicated state and fresh observations, so a new leader picks up a migration where the
old one stopped, and a step repeated after a lost answer finds its work done (a container
holds one member of a group, so a second ADD_BROKER for it is refused; a removed member or
a dropped topic that is already gone counts as done; topic steps are updates). What it
keeps in memory only makes it polite: one step in flight per group, each failure's cause
logged once, read-only retirements sent once a leadership, the last plan for
CONTROLLER_GET_PLACEMENT.

Safety does not rest on the reconciler alone: right before it removes a member or moves a
master, the driver checks the group again as the controller sees it at that moment, and it
never removes the master or the last synchronised member whatever a plan says.
"""

from hamq.controller_server.placement.answer import describe, placement_ext
from hamq.controller_server.placement.checks import (
    StepRefused,
    election_refusal,
    removal_refusal,
)
from hamq.controller_server.placement.cleanup import (
    QueueState,
    Strays,
    declared_name,
    strays,
    topic_drained,
    unwritable,
)
from hamq.controller_server.placement.driver import (
    MANAGED_GROUP_PREFIXES,
    MAX_COMPLAINTS,
    Complaints,
    PlacementDriver,
    member_settings,
)
from hamq.controller_server.placement.rounds import (
    MEMBERSHIP_STEPS,
    CollectTopics,
    Step,
    round_steps,
    step_group,
)
from hamq.controller_server.placement.world import (
    Observed,
    build_world,
    observe,
    orphans,
    unplaced_groups,
)

__all__ = [
    "MANAGED_GROUP_PREFIXES",
    "MAX_COMPLAINTS",
    "MEMBERSHIP_STEPS",
    "CollectTopics",
    "Complaints",
    "Observed",
    "PlacementDriver",
    "QueueState",
    "Step",
    "StepRefused",
    "Strays",
    "build_world",
    "declared_name",
    "describe",
    "election_refusal",
    "member_settings",
    "observe",
    "orphans",
    "placement_ext",
    "removal_refusal",
    "round_steps",
    "step_group",
    "strays",
    "topic_drained",
    "unplaced_groups",
    "unwritable",
]
