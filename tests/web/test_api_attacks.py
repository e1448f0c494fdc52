"""Hostile input and hostile clients against the management API on a real cluster: values
the wire cannot carry, bodies of many megabytes, half-sent requests by the hundred, and
what the published schema promises. The web server of ``hamq dev`` runs inside the first
name server (``web_listen``), so an attack on it is an attack on route answers too: the
name server must keep answering while it lasts."""

from __future__ import annotations

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
