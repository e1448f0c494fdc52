"""The controller's requests: every CONTROLLER_* code of the wire contract, decoded in full
(``protocol/controller.py``) before the state is read, then answered.

Requests that change the state are decided on the Raft leader and answered only once
their event is committed and applied; a follower answers CONTROLLER_NOT_LEADER with the
leader's address when it knows it. Reads are the leader's too (a follower's state may
lag), except heartbeats (of members and of nodes) and clean-shutdown notices, which
every peer records, and the metadata, which is each peer's own view. The catalog of
mirrored-queue policies (vhosts, policies, declared topics, nodes) is decided like the
groups' requests (``controller/catalog.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from hamq.broker.topics import is_system_topic
from hamq.clock import monotonic_ms
from hamq.controller.core import Applied, Outcome, Request
from hamq.controller.errors import ControllerCode, ControllerError
from hamq.controller.events import AddVhost, DeleteVhost
from hamq.controller_server.driver import ControllerDriver
from hamq.controller_server.elections import ElectionStats
from hamq.errors import InvalidArgument, RequestCodeNotSupported
from hamq.net.connection import Connection, response_pieces
from hamq.policy.definition import wire_name
from hamq.protocol import controller as wire
from hamq.protocol import controller_catalog as catalog
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame

log = logging.getLogger(__name__)

Handler = Callable[[Connection, Frame], "list | None"]
# Turns an applied event into the answer's ext.
Answer = Callable[[Applied], dict[str, Any]]


def _empty(applied: Applied) -> dict[str, Any]:
    return {}


def _replica_info(applied: Applied) -> dict[str, Any]:
    assert applied.group is not None, "register, elect and alter keep their group"
    return wire.ReplicaInfo.of_group(applied.group).to_ext()


def _sync_state_set(applied: Applied) -> dict[str, Any]:
    assert applied.group is not None, "an alter keeps its group"
    return wire.sync_state_set_ext(applied.group.sync_state_set, applied.group.sync_state_set_epoch)


def _answer(frame: Frame, ext: dict[str, Any]) -> list:
    """A list answer, in the body when the header could not hold it."""
    ext_part, body = catalog.answer_parts(ext)
    return response_pieces(frame, ext=ext_part, body=body)


class ControllerProcessor:
    def __init__(self, driver: ControllerDriver, elections: ElectionStats) -> None:
        self.driver = driver
        self.core = driver.core
        self.elections = elections
        self._handlers: dict[int, Handler] = {
            RequestCode.CONTROLLER_RAFT_MESSAGE: self._raft_message,
            RequestCode.CONTROLLER_BROKER_HEARTBEAT: self._heartbeat,
            RequestCode.CONTROLLER_GET_METADATA_INFO: self._metadata,
            RequestCode.CONTROLLER_GET_NEXT_BROKER_ID: self._next_broker_id,
            RequestCode.CONTROLLER_GET_REPLICA_INFO: self._replica_info,
            RequestCode.CONTROLLER_GET_SYNC_STATE_DATA: self._sync_state_data,
            RequestCode.CONTROLLER_APPLY_BROKER_ID: self._apply_broker_id,
            RequestCode.CONTROLLER_REGISTER_BROKER: self._register_broker,
            RequestCode.CONTROLLER_ELECT_MASTER: self._elect_master,
            RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET: self._alter_sync_state_set,
            RequestCode.CLEAN_BROKER_DATA: self._clean_broker_data,
            RequestCode.CONTROLLER_ADD_VHOST: self._add_vhost,
            RequestCode.CONTROLLER_DELETE_VHOST: self._delete_vhost,
            RequestCode.CONTROLLER_LIST_VHOSTS: self._list_vhosts,
            RequestCode.CONTROLLER_SET_POLICY: self._set_policy,
            RequestCode.CONTROLLER_CLEAR_POLICY: self._clear_policy,
            RequestCode.CONTROLLER_LIST_POLICIES: self._list_policies,
            RequestCode.CONTROLLER_DECLARE_TOPIC: self._declare_topic,
            RequestCode.CONTROLLER_DELETE_TOPIC: self._delete_topic,
            RequestCode.CONTROLLER_LIST_TOPICS: self._list_topics,
            RequestCode.CONTROLLER_REGISTER_NODE: self._register_node,
            RequestCode.CONTROLLER_NODE_HEARTBEAT: self._node_heartbeat,
            RequestCode.CONTROLLER_LIST_NODES: self._list_nodes,
            RequestCode.CONTROLLER_BROKER_SHUTDOWN: self._broker_shutdown,
        }

    def register(self, code: int, handler: Handler) -> None:
        """Serve one more code (the placement driver's CONTROLLER_GET_PLACEMENT)."""
        self._handlers[code] = handler

    def serves(self, code: int) -> bool:
        return code in self._handlers

    def handle(self, conn: Connection, frame: Frame) -> list | None:
        handler = self._handlers.get(frame.code)
        if handler is None:
            raise RequestCodeNotSupported(f"controller does not serve request code {frame.code}")
        return handler(conn, frame)

    def after_batch(self) -> None:
        pass

    # -- answers -----------------------------------------------------------------------------
    def _refusal(self, frame: Frame, error: ControllerError) -> list:
        ext = None
        if error.code == ControllerCode.CONTROLLER_NOT_LEADER:
            ext = {"leader_addr": self.driver.leader_addr}
        return response_pieces(frame, error.code, ext, error.remark)

    def _submit(self, conn: Connection, frame: Frame, request: Request, answer: Answer) -> None:
        def done(outcome: Outcome) -> None:
            if isinstance(outcome, ControllerError):
                conn.reply(self._refusal(frame, outcome))
            else:
                conn.reply(response_pieces(frame, ext=answer(outcome)))

        self.core.submit(request, monotonic_ms(), done)
        self.driver.schedule_pump()

    def not_serving(self, frame: Frame) -> list | None:
        """A read the leader must answer: the refusal, or None when this peer serves."""
        return None if self.core.serving else self._refusal(frame, self.core.not_leader())

    def _served(self, frame: Frame, build: Callable[[], dict[str, Any]]) -> list:
        """A read only the serving leader answers: the refusal, or ``build()``'s answer."""
        refusal = self.not_serving(frame)
        return refusal if refusal is not None else _answer(frame, build())

    # -- handlers ----------------------------------------------------------------------------
    def _raft_message(self, conn: Connection, frame: Frame) -> None:
        self.driver.step(frame.body, conn.peer)

    def _heartbeat(self, conn: Connection, frame: Frame) -> list | None:
        self.core.heartbeat(wire.broker_heartbeat(frame.ext), monotonic_ms())
        return None if frame.is_oneway else response_pieces(frame)

    def _metadata(self, conn: Connection, frame: Frame) -> list:
        node = self.core.node
        ext = {
            "self_id": self.driver.node_id,
            "leader_id": node.leader_id or None,
            "leader_addr": self.driver.peers.get(node.leader_id),
            "term": node.term,
            "is_leader": self.core.is_leader,
            "peers": [[i, addr] for i, addr in sorted(self.driver.peers.items())],
            "commit_index": node.committed_index,
            "applied_index": node.applied_index,
            "elections": self.elections.elections,
            "unclean_elections": self.elections.unclean_elections,
            "unclean_lost_bytes": self.elections.unclean_lost_bytes,
            "failed_elections": self.elections.failed_elections,
        }
        return response_pieces(frame, ext=ext)

    def _next_broker_id(self, conn: Connection, frame: Frame) -> list:
        key = wire.group_key(frame.ext)
        refusal = self.not_serving(frame)
        if refusal is not None:
            return refusal
        return response_pieces(frame, ext={"next_broker_id": self.core.state.next_broker_id(key)})

    def _replica_info(self, conn: Connection, frame: Frame) -> list:
        key = wire.group_key(frame.ext)
        refusal = self.not_serving(frame)
        if refusal is not None:
            return refusal
        group = self.core.group(key)
        if group is None:
            return self._refusal(
                frame,
                ControllerError(
                    ControllerCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
                    f"broker group {key[0]}/{key[1]} is not known to the controller",
                ),
            )
        return response_pieces(frame, ext=wire.ReplicaInfo.of_group(group).to_ext())

    def _sync_state_data(self, conn: Connection, frame: Frame) -> list:
        names = set(wire.broker_names(frame.ext))
        refusal = self.not_serving(frame)
        if refusal is not None:
            return refusal
        now_ms, liveness = monotonic_ms(), self.core.liveness
        groups = [
            wire.sync_state_group_ext(
                key,
                group,
                liveness.members(key),
                liveness.alive(key, now_ms),
                liveness.shutdown_epoch(key),
            )
            for key, group in sorted(self.core.state.groups.items())
            if not names or key[1] in names
        ]
        return _answer(frame, {"groups": groups})

    def _apply_broker_id(self, conn: Connection, frame: Frame) -> None:
        self._submit(conn, frame, wire.apply_broker_id_request(frame.ext), _empty)

    def _register_broker(self, conn: Connection, frame: Frame) -> None:
        who, request = wire.register_broker_request(frame.ext)
        self.core.heartbeat(who, monotonic_ms())  # registering is a sign of life too
        self._submit(conn, frame, request, _replica_info)

    def _elect_master(self, conn: Connection, frame: Frame) -> None:
        self._submit(conn, frame, wire.elect_master_request(frame.ext), _replica_info)

    def _alter_sync_state_set(self, conn: Connection, frame: Frame) -> None:
        request = wire.alter_sync_state_set_request(frame.ext)
        self._submit(conn, frame, request, _sync_state_set)

    def _clean_broker_data(self, conn: Connection, frame: Frame) -> None:
        self._submit(conn, frame, wire.clean_broker_data_request(frame.ext), _empty)

    # -- the catalog (seed 003) ---------------------------------------------------------------
    def _add_vhost(self, conn: Connection, frame: Frame) -> None:
        self._submit(conn, frame, AddVhost(catalog.vhost_request(frame.ext)), _empty)

    def _delete_vhost(self, conn: Connection, frame: Frame) -> None:
        self._submit(conn, frame, DeleteVhost(catalog.vhost_request(frame.ext)), _empty)

    def _list_vhosts(self, conn: Connection, frame: Frame) -> list:
        return self._served(frame, lambda: {"vhosts": sorted(self.core.state.vhosts)})

    def _set_policy(self, conn: Connection, frame: Frame) -> None:
        self._submit(conn, frame, catalog.set_policy_request(frame.ext), _empty)

    def _clear_policy(self, conn: Connection, frame: Frame) -> None:
        self._submit(conn, frame, catalog.clear_policy_request(frame.ext), _empty)

    def _list_policies(self, conn: Connection, frame: Frame) -> list:
        vhost = catalog.vhost_filter(frame.ext)
        return self._served(frame, lambda: catalog.policies_ext(self.core.state, vhost))

    def _declare_topic(self, conn: Connection, frame: Frame) -> None:
        event = catalog.declare_topic_request(frame.ext)
        if is_system_topic(wire_name(event.vhost, event.topic)):
            # placed in a policy's group, then dropped from the old one, it would take
            # every member's delayed or transactional messages with it
            raise InvalidArgument(f"topic {event.topic!r} is a system topic")
        self._submit(conn, frame, event, _empty)

    def _delete_topic(self, conn: Connection, frame: Frame) -> list | None:
        event, owner = catalog.delete_topic_request(frame.ext)
        key = (event.vhost, event.topic)
        holder = self.core.state.topic_owners.get(key)
        if owner and holder is not None and holder != owner:
            # RabbitMQ's RESOURCE_LOCKED: another client's exclusive topic is not this one's
            # to delete (admins and the placement driver delete without an owner)
            return self._refusal(
                frame,
                ControllerError(
                    ControllerCode.CONTROLLER_INVALID_REQUEST,
                    f"topic {event.topic!r} in vhost {event.vhost!r} is exclusive to another "
                    "connection",
                ),
            )
        self._submit(conn, frame, event, _empty)
        return None

    def _list_topics(self, conn: Connection, frame: Frame) -> list:
        vhost = catalog.vhost_filter(frame.ext)
        return self._served(frame, lambda: catalog.topics_ext(self.core.state, vhost))

    def _register_node(self, conn: Connection, frame: Frame) -> list | None:
        event = catalog.register_node_request(frame.ext)
        conflict = self._live_node_conflict(event.name, event.address)
        if conflict is not None:
            return self._refusal(
                frame, ControllerError(ControllerCode.CONTROLLER_INVALID_REQUEST, conflict)
            )
        self._submit(conn, frame, event, _empty)
        return None

    def _live_node_conflict(self, name: str, addr: str) -> str | None:
        """Why a registration would take what a live node holds (None: it would not). As
        Erlang refuses a second node of a name already up: a process elsewhere taking a
        live node's name, or a second name for a live node's container, would have the
        placement driver send members of one node to the other."""
        if not self.core.serving:
            return None  # the submit answers CONTROLLER_NOT_LEADER
        now_ms, nodes = monotonic_ms(), self.core.nodes
        registered = self.core.state.nodes.get(name)
        if registered not in (None, addr) and nodes.is_alive(name, now_ms):
            return (
                f"node {name!r} is alive at {registered}; a node at {addr} cannot take its "
                "name until it stops heartbeating"
            )
        for other, other_addr in self.core.state.nodes.items():
            if other != name and other_addr == addr and nodes.is_alive(other, now_ms):
                return f"node {other!r} is alive at {addr}; {name!r} cannot register there too"
        return None

    def _node_heartbeat(self, conn: Connection, frame: Frame) -> list | None:
        heartbeat = catalog.node_heartbeat(frame.ext)
        registered = self.core.state.nodes.get(heartbeat.node)
        # Only the registered address speaks for a node: a report naming another node's
        # members from elsewhere would keep it alive or move its members in the driver's view.
        if registered == heartbeat.address:
            self.core.node_heartbeat(heartbeat, monotonic_ms())
        elif not frame.is_oneway:
            return self._refusal(
                frame,
                ControllerError(
                    ControllerCode.CONTROLLER_INVALID_REQUEST,
                    f"node {heartbeat.node!r} is registered at {registered}, not at "
                    f"{heartbeat.address}",
                ),
            )
        return None if frame.is_oneway else response_pieces(frame)

    def _list_nodes(self, conn: Connection, frame: Frame) -> list:
        state, nodes = self.core.state, self.core.nodes
        return self._served(frame, lambda: catalog.nodes_ext(state, nodes, monotonic_ms()))

    def _broker_shutdown(self, conn: Connection, frame: Frame) -> list | None:
        """Every peer records the notice (like heartbeats): the one leading when the
        master's heartbeats time out decides by it."""
        notice = catalog.broker_shutdown(frame.ext)
        if self.core.broker_shutdown(notice):
            log.info(
                "master %d of %s/%s is shutting down cleanly (epoch %d)",
                notice.broker_id,
                notice.cluster_name,
                notice.broker_name,
                notice.epoch,
            )
        return None if frame.is_oneway else response_pieces(frame)
