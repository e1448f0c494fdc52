"""Hostile input and hostile clients against the management API on a real cluster: values
the wire cannot carry, bodies of many megabytes, half-sent requests by the hundred, and
what the published schema promises. The web server of ``hamq dev`` runs inside the first
name server (``web_listen``), so an attack on it is an attack on route answers too: the
name server must keep answering while it lasts."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

from hamq.web.body_limit import MAX_BODY_BYTES

GOOD_POLICY = {"pattern": "^attack\\.", "definition": {"ha-mode": "all"}}
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


def _name_server_web(web_cluster) -> tuple[str, int]:
    url = urlsplit(web_cluster.ready["web"]["url"])
    assert url.hostname and url.port
    return url.hostname, url.port


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
