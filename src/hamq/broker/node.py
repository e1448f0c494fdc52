"""A node (seed 003): a ``BrokerContainer`` with a ``node_name`` is what RabbitMQ calls
``rabbit@host``, a place where the controller's placement driver puts members of policy
groups. The node tells the controller it exists (CONTROLLER_REGISTER_NODE, retried until
a leader takes it) and then heartbeats every controller peer with the members it hosts,
so the driver knows which node is alive and where each member runs.

Topics are declared through a node (DECLARE_TOPIC on the container's port): the node is
the topic's home (RabbitMQ's ``client-local`` master locator), and an exclusive topic is
owned by the declaring connection, deleted when that connection closes (RabbitMQ's
exclusive queue). The owner is a connection id unique in this process (a random prefix
per process, so a restarted node never reuses one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hamq.client.controller import ControllerClient
from hamq.config import ContainerConfig
from hamq.controller.nodes import HostedMember
from hamq.errors import HamqError
from hamq.net.tasks import PeriodicTask, spawn
from hamq.policy.definition import DEFAULT_VHOST, check_vhost
from hamq.protocol.frame import optional, require, require_name
from hamq.protocol.limits import MAX_QUEUE_NUMS, MAX_TOPIC_LENGTH

log = logging.getLogger(__name__)

# Registration is retried with a doubling pause up to this (a controller without a leader
# yet, or not started: the node comes up first in a fresh cluster).
REGISTER_RETRY_FIRST_S = 0.1
REGISTER_RETRY_MAX_S = 5.0
# Deleting a closed connection's exclusive topic is tried this many times, the pause
# doubling from the first; after that the placement driver's own sweep of topics whose
# owner is gone is what deletes it.
DELETE_ATTEMPTS = 5
DELETE_RETRY_FIRST_S = 0.2
STOP_DELETES_WAIT_S = 5.0  # a stopping node waits this long for those deletes
DEFAULT_QUEUE_NUMS = 4

Members = Callable[[], list[HostedMember]]


@dataclass(frozen=True)
class Declare:
    """A DECLARE_TOPIC request's fields, checked."""

    vhost: str
    topic: str
    exclusive: bool
    queue_nums: int

    @staticmethod
    def from_ext(ext: dict[str, Any]) -> Declare:
        return Declare(
            *declared_name(ext),
            require(ext, "exclusive", bool) if "exclusive" in ext else False,
            optional(ext, "queue_nums", DEFAULT_QUEUE_NUMS, 1, MAX_QUEUE_NUMS),
        )


def declared_name(ext: dict[str, Any]) -> tuple[str, str]:
    """(vhost, topic) of a DECLARE_TOPIC or UNDECLARE_TOPIC request, checked (no vhost:
    the default one)."""
    return check_vhost(ext.get("vhost", DEFAULT_VHOST)), require_name(
        ext, "topic", MAX_TOPIC_LENGTH
    )


class Node:
    """``members()`` lists the hosted members for the heartbeat."""

    def __init__(self, config: ContainerConfig, members: Members) -> None:
        self.name = config.node_name
        self.address = config.listen
        self.members = members
        self.client = ControllerClient(config.controller_addr)
        self._heartbeat = PeriodicTask(
            f"node {self.name} heartbeat",
            config.node_heartbeat_interval_ms / 1000,
            self._beat,
            errors=(HamqError, OSError),
        )
        self._register: asyncio.Task | None = None
        self._owner_prefix = f"{self.name}/{os.urandom(4).hex()}/"
        self._owner_ids = itertools.count(1)
        self._exclusive: dict[str, set[tuple[str, str]]] = {}  # owner -> (vhost, topic)
        # Open declaring connections, listed in every heartbeat: the placement driver
        # deletes an exclusive topic whose owner its node no longer lists (a delete on
        # close that never reached the controller, or a declare that finished after its
        # connection closed).
        self._open_owners: set[str] = set()
        self._deletes: set[asyncio.Task] = set()

    def start(self) -> None:
        """Registers in the background (the members start meanwhile), heartbeats once
        registered."""
        self._register = spawn(self._register_until_taken())

    async def stop(self) -> None:
        if self._register is not None:
            self._register.cancel()
            await asyncio.gather(self._register, return_exceptions=True)
        await self._heartbeat.stop()
        # The container closed every connection first: their exclusive topics are being
        # deleted. A controller that does not answer in time leaves them to the placement
        # driver, which deletes a dead node's exclusive topics.
        if self._deletes:
            _, late = await asyncio.wait(set(self._deletes), timeout=STOP_DELETES_WAIT_S)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        await self.client.close()

    async def _register_until_taken(self) -> None:
        pause = REGISTER_RETRY_FIRST_S
        for attempt in itertools.count(1):
            try:
                await self.client.register_node(self.name, self.address)
            except HamqError as err:
                if attempt == 1 or pause >= REGISTER_RETRY_MAX_S:
                    log.warning("node %s not registered yet: %s", self.name, err.message)
                await asyncio.sleep(pause)
                pause = min(pause * 2, REGISTER_RETRY_MAX_S)
                continue
            log.info("node %s registered with the controller at %s", self.name, self.address)
            self._heartbeat.start()
            self._heartbeat.wake()
            return

    async def _beat(self) -> None:
        await self.client.node_heartbeat(self.name, self.address, self.members(), self._open_owners)

    # -- declared topics -----------------------------------------------------------------
    def new_owner(self) -> str:
        """An id for a client connection, the owner of the exclusive topics it declares;
        open until ``connection_closed``."""
        owner = f"{self._owner_prefix}{next(self._owner_ids)}"
        self._open_owners.add(owner)
        return owner

    async def declare(self, owner: str, declare: Declare) -> dict[str, Any]:
        """The declaration as the controller took it, homed on this node (declared
        again alike, a no-op; otherwise the controller's refusal)."""
        await self.client.declare_topic(
            declare.vhost,
            declare.topic,
            self.name,
            exclusive=declare.exclusive,
            queue_nums=declare.queue_nums,
            owner=owner if declare.exclusive else "",
        )
        if declare.exclusive:
            self._exclusive.setdefault(owner, set()).add((declare.vhost, declare.topic))
            if owner not in self._open_owners:  # the connection closed while it declared
                self.connection_closed(owner)
        return {**dataclasses.asdict(declare), "home_node": self.name}

    async def undeclare(self, owner: str, vhost: str, topic: str) -> None:
        await self.client.delete_topic(vhost, topic, owner)
        owned = self._exclusive.get(owner)
        if owned is not None:
            owned.discard((vhost, topic))

    def connection_closed(self, owner: str) -> None:
        """The exclusive topics ``owner`` declared are deleted (in the background)."""
        self._open_owners.discard(owner)
        for vhost, topic in self._exclusive.pop(owner, ()):
            task = spawn(self._delete_exclusive(vhost, topic))
            self._deletes.add(task)
            task.add_done_callback(self._deletes.discard)

    async def _delete_exclusive(self, vhost: str, topic: str) -> None:
        pause = DELETE_RETRY_FIRST_S
        for attempt in range(1, DELETE_ATTEMPTS + 1):
            try:
                await self.client.delete_topic(vhost, topic)
            except HamqError as err:
                log.warning(
                    "node %s: exclusive topic %s in vhost %s not deleted (attempt %d of %d): %s",
                    *(self.name, topic, vhost, attempt, DELETE_ATTEMPTS, err.message),
                )
                if not err.retriable:  # a refusal (already gone, say): asking again is no use
                    return
                await asyncio.sleep(pause)
                pause *= 2
                continue
            log.info("node %s: exclusive topic %s in vhost %s deleted", self.name, topic, vhost)
            return
