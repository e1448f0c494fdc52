"""Hostile input and hostile clients against the management API on a real cluster: values
the wire cannot carry, bodies of many megabytes, half-sent requests by the hundred, and
what the published schema promises. The web server of ``hamq dev`` runs inside the first
name server (``web_listen``), so an attack on it is an attack on route answers too: the
name server must keep answering while it lasts."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from hamq.client.admin import AsyncAdmin
from hamq.errors import InvalidArgument
from hamq.policy.definition import check_vhost
from hamq.protocol.limits import MAX_TOPIC_LENGTH
from hamq.protocol.message import validate_name
from hamq.web.body_limit import MAX_BODY_BYTES
from hamq.web.http_guard import MAX_CONNECTIONS, REQUEST_TIMEOUT_S
from hamq.web.names import NAME_PATTERN, VHOST_PATTERN
from helpers import wait_for

GOOD_POLICY = {"pattern": "^api-attack\\.", "definition": {"ha-mode": "all"}}  # no topic
RACERS = 8
NO_QUORUM_ANSWER_S = 15.0  # the controller client's bounded retries, on a loaded machine
ROUTE_ANSWER_S = 2.0  # a name server's answer to a client, even while its web port is attacked


def _put_raw(web_cluster, path: str, raw: bytes):
    return web_cluster.request("PUT", path, raw=raw, headers={"content-type": "application/json"})


def test_policy_values_the_wire_cannot_carry_are_400_naming_the_field(web_cluster):
    """Each was a 500 (msgpack's OverflowError, UTF-8's UnicodeEncodeError) that also cut
    the client's connection."""
    cases = [
        ({**GOOD_POLICY, "priority": -(2**63) - 1}, "priority"),
        ({**GOOD_POLICY, "priority": 2**63}, "priority"),
        ({**GOOD_POLICY, "definition": {"ha-mode": "exactly", "ha-params": 10**30}}, None),
    ]
    for body, field in cases:
        answer = web_cluster.request("PUT", "api/policies/%2f/attack", body)
        assert answer.status == 400, (body, answer)
        assert answer.body["name"] == "INVALID_ARGUMENT"
        assert answer.body["field"] == (field or "definition.ha-params"), answer.body
    # a lone surrogate is valid JSON but no text UTF-8 (and so the wire) can carry
    surrogate = '{"pattern": "^a\\ud800", "definition": {"ha-mode": "all"}}'
    answer = _put_raw(web_cluster, "api/policies/%2f/attack", surrogate.encode())
    assert (answer.status, answer.body["field"]) == (400, "pattern"), answer
    key = '{"pattern": "^a", "definition": {"ha-mode": "all", "\\ud800": 1}}'
    answer = _put_raw(web_cluster, "api/policies/%2f/attack", key.encode())
    assert answer.status == 400, answer
    assert answer.body["field"] == "definition.\\ud800", answer.body
    assert web_cluster.request("PUT", "api/policies/%2f/attack", GOOD_POLICY).status == 201
    assert web_cluster.request("DELETE", "api/policies/%2f/attack").status == 204


def test_concurrent_deletes_one_wins_the_others_are_404(web_cluster):
    """The losers of a DELETE race were 400 bad_request (the controller refuses them at
    apply: "a concurrent change to the catalog came first"); they came second: 404."""

    def race(path: str) -> list[int]:
        with ThreadPoolExecutor(RACERS) as pool:
            answers = list(pool.map(lambda _: web_cluster.request("DELETE", path), range(RACERS)))
        return sorted(a.status for a in answers)

    assert web_cluster.request("PUT", "api/policies/%2f/race", GOOD_POLICY).status == 201
    assert race("api/policies/%2f/race") == [204] + [404] * (RACERS - 1)
    assert web_cluster.request("PUT", "api/vhosts/race").status == 201
    assert race("api/vhosts/race") == [204] + [404] * (RACERS - 1)


def _assert_400(answer, field: str) -> None:
    assert answer.status == 400, answer
    assert (answer.body["name"], answer.body["field"]) == ("INVALID_ARGUMENT", field), answer.body


def test_json_of_the_wrong_type_is_400_naming_the_field(web_cluster):
    """RabbitMQ's and RocketMQ's clients send typed JSON: "3" or true for a number was
    taken as 3 or 1 (a policy's priority, a topic's queue count, an elected member)."""
    for priority in ("3", True, 3.5):
        answer = web_cluster.request(
            "PUT", "api/policies/%2f/lax", {**GOOD_POLICY, "priority": priority}
        )
        _assert_400(answer, "priority")
    for queues in ("4", True):
        _assert_400(
            web_cluster.request("PUT", "api/topics/lax.t", {"read_queues": queues}), "read_queues"
        )
    # member ids start at 1 (controller and DLedger alike): 0 is no member to elect
    for broker_id in ("1", True, 0, -1):
        elect = {"action": "elect_master", "broker_id": broker_id}
        _assert_400(web_cluster.request("POST", "api/groups/g/actions", elect), "broker_id")
    reset = {"action": "reset_offset", "topic": "t", "timestamp_ms": "0"}
    _assert_400(web_cluster.request("POST", "api/consumer-groups/g/actions", reset), "timestamp_ms")


def test_an_unknown_vhost_is_404_on_the_rocketmq_routes_too(web_cluster):
    """``?vhost=nosuch`` answered 200 [] (an empty list of a vhost that does not exist),
    where the RabbitMQ-shaped routes say 404."""
    for path in (
        "api/topics?vhost=nosuch",
        "api/topics/t?vhost=nosuch",
        "api/consumer-groups?vhost=nosuch",
        "api/consumer-groups/g?vhost=nosuch",
        "api/messages/t?key=k&vhost=nosuch",
    ):
        answer = web_cluster.request("GET", path)
        assert answer.status == 404, (path, answer)
        assert (answer.body["name"], answer.body["field"]) == ("QUERY_NOT_FOUND", "vhost")
    assert web_cluster.request("PUT", "api/vhosts/known").status == 201
    assert web_cluster.get("api/topics?vhost=known") == []
    assert web_cluster.request("DELETE", "api/vhosts/known").status == 204


def _admits(pattern: str, name: str) -> bool:
    return re.search(pattern, name) is not None


def _accepted(check, name: str) -> bool:
    try:
        check(name)
    except InvalidArgument:
        return False
    return True


def test_the_name_patterns_admit_every_name_the_checks_admit():
    """The schema's patterns tell clients which names are refused; the server's checks
    decide, so a pattern stricter than its check would refuse a name the cluster takes."""
    samples = [c * n for c in map(chr, range(0x20, 0x250)) for n in (1, 2)]
    samples += ["/", "%RETRY%g", "a" * 64, "a" * 65, "a" * 127, "a" * 128]
    for name in samples:
        if _accepted(lambda n: validate_name(n, "topic", MAX_TOPIC_LENGTH), name):
            assert _admits(NAME_PATTERN, name) and len(name) <= MAX_TOPIC_LENGTH, name
        if _accepted(check_vhost, name):
            assert _admits(VHOST_PATTERN, name), name


def test_the_schema_states_the_name_rules(web_cluster):
    """Names in paths and queries carry their pattern and length in the schema, so a
    fuzzer stops sending names the server must refuse (and a client can check first)."""
    stated = {}
    for path, operations in web_cluster.get("api/openapi.json")["paths"].items():
        for operation in operations.values():
            for param in operation.get("parameters", []):
                if param["name"] in ("vhost", "topic", "group", "broker_name"):
                    schema = param["schema"]
                    schema = next((s for s in schema.get("anyOf", []) if "pattern" in s), schema)
                    stated[(path, param["name"])] = schema.get("pattern")
    assert stated and None not in stated.values(), stated
    assert stated[("/api/topics", "vhost")] == VHOST_PATTERN
    assert stated[("/api/topics/{topic}", "topic")] == NAME_PATTERN
    answer = web_cluster.request("GET", "api/topics?vhost=a%25b")
    _assert_400(answer, "vhost")
    _assert_400(web_cluster.request("PUT", "api/vhosts/a%25b"), "vhost")


def test_a_405_says_every_method_the_path_takes(web_cluster):
    """FastAPI makes one route per method and Starlette's 405 named the methods of the
    first route whose path matched: ``Allow: GET`` where PUT and DELETE are served too."""
    for method, path, allow in (
        ("PATCH", "api/policies/%2f/p", "DELETE, GET, PUT"),
        ("OPTIONS", "api/policies/0/x", "DELETE, GET, PUT"),
        ("POST", "api/vhosts/v", "DELETE, GET, PUT"),
        ("PATCH", "api/topics/t", "DELETE, GET, PUT"),
        ("DELETE", "api/overview", "GET"),
    ):
        answer = web_cluster.request(method, path)
        assert answer.status == 405, (method, path, answer)
        assert answer.headers["allow"] == allow, (method, path, answer.headers)
        assert answer.body["name"] == "REQUEST_CODE_NOT_SUPPORTED", answer.body


def _name_server_web(web_cluster) -> tuple[str, int]:
    url = urlsplit(web_cluster.ready["web"]["url"])
    assert url.hostname and url.port
    return url.hostname, url.port


async def _route_answer_s(namesrv: str) -> float:
    """How long the name server serving the web takes to answer a cluster-info request
    (on a connection opened now: a descriptor it must still be able to accept)."""
    admin = AsyncAdmin([namesrv])
    try:
        started = time.monotonic()
        await asyncio.wait_for(admin.cluster_info(), 10)
        return time.monotonic() - started
    finally:
        await admin.close()


def test_a_body_over_the_limit_is_refused_as_it_streams_in(web_cluster):
    """A 300 MB body was read whole and parsed on the name server's loop (its routes
    stalled 3 s); now a body over MAX_BODY_BYTES is a 413 in the one error shape, answered
    before the body is sent (here: only its first bytes ever are)."""
    host, port = _name_server_web(web_cluster)

    async def put_big() -> tuple[bytes, dict]:
        reader, writer = await asyncio.open_connection(host, port)
        head = (
            "PUT /api/policies/%2f/big HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Length: {300 * MAX_BODY_BYTES}\r\n\r\n"
        )
        writer.write(head.encode() + b'{"pattern": "' + b"a" * 65536)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        status_line, _, rest = answer.partition(b"\r\n")
        return status_line, json.loads(rest.partition(b"\r\n\r\n")[2])

    status_line, body = asyncio.run(put_big())
    assert b" 413 " in status_line, (status_line, body)
    assert body["name"] == "INVALID_ARGUMENT", body


async def _half_sent(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
    await writer.drain()
    return reader, writer


async def _closed_by_server(reader: asyncio.StreamReader, timeout_s: float) -> bytes | None:
    """What the server sent before closing, or None if it kept the connection open."""
    try:
        return await asyncio.wait_for(reader.read(), timeout_s)
    except TimeoutError:
        return None
    except ConnectionResetError:
        return b""


def test_half_sent_requests_are_closed_and_connections_bounded(web_cluster):
    """Slowloris on the web port of a name server: connections beyond MAX_CONNECTIONS are
    closed at once, every half-sent request is closed after REQUEST_TIMEOUT_S, and
    the name server answers its own clients quickly throughout. (uvicorn kept every one
    open for ever: each a descriptor of the name server's process.)"""
    host, port = _name_server_web(web_cluster)
    namesrv = web_cluster.namesrv.split(";")[0]  # the name server serving it
    vhosts = web_cluster.get("api/vhosts")

    async def attack() -> None:
        extra = 20
        conns = [await _half_sent(host, port) for _ in range(MAX_CONNECTIONS + extra)]
        try:
            assert await _route_answer_s(namesrv) < ROUTE_ANSWER_S
            # the connections past the cap are closed right away
            early = await asyncio.gather(*(_closed_by_server(r, 3.0) for r, _ in conns[-extra:]))
            assert None not in early, f"{early.count(None)} of {extra} past the cap still open"
            # every other one is closed once its request is overdue
            late = await asyncio.gather(
                *(_closed_by_server(r, REQUEST_TIMEOUT_S + 5) for r, _ in conns[:-extra])
            )
            assert all(x is not None for x in late), f"{late.count(None)} still open"
            assert await _route_answer_s(namesrv) < ROUTE_ANSWER_S
        finally:
            for _, writer in conns:
                writer.close()

    asyncio.run(attack())
    assert web_cluster.get("api/vhosts") == vhosts


def test_the_schema_documents_only_the_errors_the_api_answers(web_cluster):
    """Bad input is 400 with ErrorBody; FastAPI's own 422 HTTPValidationError was
    documented on every route with a parameter though the API never answers it."""
    schema = web_cluster.get("api/openapi.json")
    error_ref = {"$ref": "#/components/schemas/ErrorBody"}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                assert status != "422", (method, path)
                if status[0] in "45":
                    content = response["content"]["application/json"]["schema"]
                    assert content == error_ref, (method, path, status)
    assert "HTTPValidationError" not in schema["components"]["schemas"]


def test_the_overview_answers_while_the_controllers_have_no_quorum(
    web_cluster, controllers_revived
):
    """It kills two of the three controller peers (started again after it). The overview
    was a 503 as a whole (its node count asks the controller) exactly when an operator needs it;
    the routes that only the controller can answer are a bounded 503 with the wire code."""
    web_cluster.mc.declare("attacks.q", "hamq@node1")  # a group for /api/groups to show
    web_cluster.mc.placed("attacks.q", lambda row: row["pid"] is not None, "a master")
    for peer in web_cluster.ready["controllers"][1:]:
        os.kill(peer["pid"], signal.SIGKILL)

    def unavailable():  # once the survivor, leader or not, knows it has no quorum
        started = time.monotonic()
        answer = web_cluster.request("GET", "api/policies")
        assert time.monotonic() - started < NO_QUORUM_ANSWER_S
        assert answer.status in (200, 503), answer
        return answer.status == 503 and answer.body["name"]

    assert wait_for(unavailable, NO_QUORUM_ANSWER_S * 2, "a 503 from the controller routes")
    overview = web_cluster.get("api/overview")  # what the name servers know
    # the broker processes the name servers register: each node's container once
    pids = {n["pid"] for n in web_cluster.get("api/nodes")}
    assert pids <= {n["pid"] for n in web_cluster.ready["nodes"]}
    assert overview["node_count"] == len(pids)
    groups = web_cluster.get("api/groups")  # as the members report them (was a 503)
    assert sorted(g["broker_name"] for g in groups) == sorted(
        g["broker_name"] for g in overview["groups"]
    )
    assert groups and all(g["controller_error"] for g in groups), groups
    one = web_cluster.get(f"api/groups/{groups[0]['broker_name']}")  # was a 503
    assert one["controller_error"] and one["members"], one
