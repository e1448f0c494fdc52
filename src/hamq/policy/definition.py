"""Mirrored-queue policies as RabbitMQ writes them, checked once where they enter.

A policy is ``{vhost, name, pattern, apply_to, priority, definition}`` (rabbit_policy.erl);
its definition carries RabbitMQ's ``ha-*`` keys and ``queue-master-locator``. Everything is
validated here, when a policy is set, so the controller's replicated state only ever holds
policies the reconciler can act on, and a bad one is refused with the key it got wrong.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Final

from hamq.config_check import NODE_NAME, QUEUE_MASTER_LOCATORS, did_you_mean
from hamq.errors import InvalidArgument
from hamq.policy.pattern import PatternError, compile_pattern, search
from hamq.protocol.limits import INT64_MAX, MAX_NAME_LENGTH
from hamq.protocol.properties import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX

DEFAULT_VHOST: Final = "/"
_VHOST_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# RocketMQ 5's NamespaceUtil joins a namespace and a resource name with '%'.
_NAMESPACE_SEPARATOR: Final = "%"
_SYSTEM_PREFIXES: Final = (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)

SYNC_MODES: Final = ("manual", "automatic")
PROMOTE_RULES: Final = ("when-synced", "always")
APPLY_TO: Final = ("topics", "all")
# RabbitMQ's word for what hamq calls a topic: its policies say "queues".
_APPLY_TO_ALIASES: Final = {"queues": "topics"}
MAX_SYNC_BATCH_SIZE: Final = 1_000_000
# The controller stores a priority as a 32-bit integer (CONTROLLER_SET_POLICY checks it).
MIN_PRIORITY: Final = -(2**31)
MAX_PRIORITY: Final = 2**31 - 1

_KEYS: Final = (
    "ha-mode",
    "ha-params",
    "ha-sync-mode",
    "ha-sync-batch-size",
    "ha-promote-on-shutdown",
    "ha-promote-on-failure",
    "queue-master-locator",
)


class PolicyError(InvalidArgument):
    """A policy, definition or vhost that cannot be stored; the message names the field."""


class HaMode(Enum):
    ALL = "all"
    EXACTLY = "exactly"
    NODES = "nodes"


@dataclasses.dataclass(frozen=True)
class HaDefinition:
    """A checked definition. ``given`` remembers which keys the user wrote, so
    ``to_json`` shows the definition as it was set; it takes no part in equality."""

    ha_mode: HaMode | None = None
    ha_params: int | tuple[str, ...] | None = None
    ha_sync_mode: str = "manual"
    ha_sync_batch_size: int = 4096
    ha_promote_on_shutdown: str = "when-synced"
    ha_promote_on_failure: str = "when-synced"
    queue_master_locator: str | None = None
    given: frozenset[str] = dataclasses.field(default=frozenset(), compare=False)

    def to_json(self) -> dict[str, object]:
        """RabbitMQ's key names, only the keys that were given."""
        values: dict[str, object] = {
            "ha-mode": self.ha_mode.value if self.ha_mode is not None else None,
            "ha-params": list(self.ha_params)
            if isinstance(self.ha_params, tuple)
            else self.ha_params,
            "ha-sync-mode": self.ha_sync_mode,
            "ha-sync-batch-size": self.ha_sync_batch_size,
            "ha-promote-on-shutdown": self.ha_promote_on_shutdown,
            "ha-promote-on-failure": self.ha_promote_on_failure,
            "queue-master-locator": self.queue_master_locator,
        }
        return {key: values[key] for key in _KEYS if key in self.given}


@dataclasses.dataclass(frozen=True)
class Policy:
    vhost: str
    name: str
    pattern: str
    apply_to: str
    priority: int
    definition: HaDefinition

    def matches(self, vhost: str, topic: str) -> bool:
        """RabbitMQ's ``re:run`` match: the pattern may match anywhere in the name (in
        linear time: ``policy.pattern``)."""
        return vhost == self.vhost and search(self.pattern, topic)


def _one_of(key: str, value: object, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise PolicyError(f"{key} = {value!r}: must be one of {choices}")
    return value


def _positive_int(key: str, value: object, high: int | None = None) -> int:
    # to Python a bool is an int; in a JSON definition it is not
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PolicyError(f"{key} = {value!r}: must be a positive integer")
    if high is not None and value > high:
        raise PolicyError(f"{key} = {value!r}: must be at most {high}")
    return value


def _ha_params(mode: HaMode, value: object) -> int | tuple[str, ...] | None:
    if mode is HaMode.ALL:
        if value is not None:
            raise PolicyError(f"ha-params = {value!r}: not allowed with ha-mode 'all'")
        return None
    if value is None:
        raise PolicyError(f"ha-params: required with ha-mode {mode.value!r}")
    if mode is HaMode.EXACTLY:
        return _positive_int("ha-params", value, INT64_MAX)  # what the wire can carry
    if not isinstance(value, list | tuple) or not value:
        raise PolicyError(
            f"ha-params = {value!r}: ha-mode 'nodes' needs a non-empty list of node names"
        )
    for node in value:
        if not isinstance(node, str) or not NODE_NAME.fullmatch(node):
            raise PolicyError(f"ha-params: node {node!r} must look like hamq@host")
    return tuple(dict.fromkeys(value))  # a node listed twice is still one mirror


def parse_definition(raw: Mapping[str, object]) -> HaDefinition:
    """A definition from its JSON form; raises ``PolicyError`` naming the bad key."""
    if not isinstance(raw, Mapping):
        raise PolicyError(f"definition must be a JSON object, got {type(raw).__name__}")
    if not raw:
        raise PolicyError("definition is empty: give at least ha-mode or queue-master-locator")
    for key in raw:
        if key not in _KEYS:
            raise PolicyError(f"definition key {key!r} is not known{did_you_mean(key, _KEYS)}")
    if "ha-mode" not in raw:
        others = [k for k in raw if k.startswith("ha-")]
        if others:
            raise PolicyError(f"{others[0]}: ha-mode is required with any other ha- key")
    default = HaDefinition()
    mode = None
    if "ha-mode" in raw:
        mode = HaMode(_one_of("ha-mode", raw["ha-mode"], tuple(m.value for m in HaMode)))

    def choice(key: str, allowed: tuple[str, ...], fallback: str) -> str:
        return _one_of(key, raw[key], allowed) if key in raw else fallback

    batch = default.ha_sync_batch_size
    if "ha-sync-batch-size" in raw:
        batch = _positive_int("ha-sync-batch-size", raw["ha-sync-batch-size"], MAX_SYNC_BATCH_SIZE)
    locator = raw.get("queue-master-locator")
    return HaDefinition(
        ha_mode=mode,
        ha_params=_ha_params(mode, raw.get("ha-params")) if mode is not None else None,
        ha_sync_mode=choice("ha-sync-mode", SYNC_MODES, default.ha_sync_mode),
        ha_sync_batch_size=batch,
        ha_promote_on_shutdown=choice(
            "ha-promote-on-shutdown", PROMOTE_RULES, default.ha_promote_on_shutdown
        ),
        ha_promote_on_failure=choice(
            "ha-promote-on-failure", PROMOTE_RULES, default.ha_promote_on_failure
        ),
        queue_master_locator=None
        if locator is None
        else _one_of("queue-master-locator", locator, QUEUE_MASTER_LOCATORS),
        given=frozenset(raw),
    )


def check_vhost(name: object) -> str:
    """``/`` or a plain name: a vhost becomes part of wire names, so it stays simple."""
    if not isinstance(name, str) or not (name == DEFAULT_VHOST or _VHOST_NAME.fullmatch(name)):
        raise PolicyError(f"vhost = {name!r}: must be '/' or 1-64 letters, digits, '_', '.', '-'")
    return name


def check_stored_policy_name(name: object) -> str:
    """The name of a policy that may already exist: what older versions let be created
    (printable text, "/" and blanks included), so such a policy is still read back from
    the log or a snapshot, listed and deleted."""
    if not isinstance(name, str) or not name:
        raise PolicyError(f"policy name = {name!r}: must be a non-empty string")
    if len(name) > MAX_NAME_LENGTH or not name.isprintable():
        raise PolicyError(f"policy name = {name!r}: at most {MAX_NAME_LENGTH} printable characters")
    return name


def check_policy_name(name: object) -> str:
    """The name of a policy being created: one every interface can address. A "/" is the
    separator of ``/api/policies/{vhost}/{name}`` (and URLs, proxies decode ``%2f``), and
    blanks at the ends vanish when a form or a shell trims what is typed."""
    name = check_stored_policy_name(name)
    if "/" in name:
        raise PolicyError(f"policy name = {name!r}: must not contain '/'")
    if name != name.strip():
        raise PolicyError(f"policy name = {name!r}: must not be blank or start or end with a blank")
    return name


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_pattern(pattern: object) -> str:
    if not isinstance(pattern, str) or len(pattern) > MAX_NAME_LENGTH:
        raise PolicyError(
            f"pattern = {pattern!r:.80}: must be a string of at most {MAX_NAME_LENGTH} characters"
        )
    if not _is_utf8(pattern):
        raise PolicyError(f"pattern = {pattern!r}: not valid Unicode text (a lone surrogate)")
    try:
        compile_pattern(pattern)
    except PatternError as err:
        raise PolicyError(
            f"pattern = {pattern!r}: not a regular expression hamq runs ({err})"
        ) from None
    return pattern


def make_policy(
    vhost: str,
    name: str,
    pattern: str,
    definition_raw: Mapping[str, object],
    *,
    priority: int = 0,
    apply_to: str = "topics",
    stored: bool = False,
) -> Policy:
    """A policy with every field checked (``apply_to`` "queues" is read as "topics");
    ``stored``: one read back from the log or a snapshot, whose name may predate the
    rules of ``check_policy_name``."""
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise PolicyError(f"priority = {priority!r}: must be an integer")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise PolicyError(f"priority = {priority}: must be in {MIN_PRIORITY}..{MAX_PRIORITY}")
    apply_to = _APPLY_TO_ALIASES.get(apply_to, apply_to) if isinstance(apply_to, str) else apply_to
    return Policy(
        vhost=check_vhost(vhost),
        name=check_stored_policy_name(name) if stored else check_policy_name(name),
        pattern=_check_pattern(pattern),
        apply_to=_one_of("apply-to", apply_to, APPLY_TO),
        priority=priority,
        definition=parse_definition(definition_raw),
    )


def effective_policy(policies: Iterable[Policy], vhost: str, topic: str) -> Policy | None:
    """The one policy that applies to a topic: the matching one with the highest priority.

    Ties: RabbitMQ sorts the matches with ``lists:sort(fun sort_pred/2, ...)`` where
    ``sort_pred(A, B) -> priority(A) >= priority(B)`` and takes the head, so among equal
    priorities it keeps the order the runtime-parameter table listed them in, which that
    table does not define. hamq makes the tie deterministic: the policy whose name sorts
    first wins (same answer on every controller, in every snapshot).
    """
    matching = [p for p in policies if p.matches(vhost, topic)]
    if not matching:
        return None
    return min(matching, key=lambda p: (-p.priority, p.name))


def wire_name(vhost: str, name: str) -> str:
    """The name a topic or consumer group has on the wire (RocketMQ 5's
    ``NamespaceUtil.wrapNamespace``): ``name`` in the default vhost, else ``vhost%name``."""
    return name if vhost == DEFAULT_VHOST else f"{vhost}{_NAMESPACE_SEPARATOR}{name}"


def split_wire_name(wire: str) -> tuple[str, str]:
    """``(vhost, name)`` from a wire name; a name without a vhost is in the default one.
    A retry or dead-letter topic keeps its prefix on the name (``%RETRY%V%g`` is ``g``'s
    retry topic in ``V``), as ``NamespaceUtil.withoutNamespace`` reads it."""
    prefix = next((p for p in _SYSTEM_PREFIXES if wire.startswith(p)), "")
    vhost, sep, name = wire.removeprefix(prefix).partition(_NAMESPACE_SEPARATOR)
    if not sep:
        return DEFAULT_VHOST, wire
    return check_vhost(vhost), prefix + name
