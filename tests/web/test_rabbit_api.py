"""The RabbitMQ-shaped routes of the management API against a real three-node cluster
(seed 003): the seed's ``PUT /api/policies/%2f/ha-all`` with the real curl, a topic
``ha.x`` showing that policy and its three copies in ``/api/queues``, the queue actions,
vhosts, nodes, the overview and history; and bad input, which is always a 4xx with the
error body naming the field, never a 500."""

from __future__ import annotations

import json
import subprocess

import pytest
from mirrored_cluster import send_confirmed

import hamq
from helpers import wait_for

SEED_BODY = '{"pattern":"^ha.", "definition":{"ha-mode":"all"}}'
ERROR_KEYS = {"error", "reason", "code", "name", "field"}
PLACEMENT_TIMEOUT_S = 30.0
SENDS = 20


def curl(*args: str) -> int:
    """The real curl; the HTTP status it got."""
    done = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(done.stdout)


def assert_error(answer, status: int, field: str | None, name: str | None = None) -> None:
    assert answer.status == status, answer
    assert set(answer.body) == ERROR_KEYS, answer.body
    assert answer.body["field"] == field, answer.body
    assert answer.body["error"] in {"bad_request", "not_found"}
    if name is not None:
        assert answer.body["name"] == name, answer.body


def test_seed_policy_put_verbatim_with_curl(web_cluster):
    """As the seed writes it, without a content type (RabbitMQ reads any body as JSON),
    then again with RabbitMQ's documented ``-H content-type``: created, then updated."""
    url = f"{web_cluster.url}api/policies/%2f/ha-all"
    assert curl("-X", "PUT", url, "-d", SEED_BODY) == 201
    assert curl("-H", "content-type:application/json", "-X", "PUT", url, "-d", SEED_BODY) == 204
    policy = web_cluster.get("api/policies/%2f/ha-all")
    assert policy == {
        "vhost": "/",
        "name": "ha-all",
        "pattern": "^ha.",
        "apply-to": "topics",
        "definition": {"ha-mode": "all"},
        "priority": 0,
    }
    assert policy in web_cluster.get("api/policies")
    assert policy in web_cluster.get("api/policies/%2f")


def test_ha_topic_shows_its_policy_and_three_copies(web_cluster):
    web_cluster.mc.admin("set-policy", "ha-all", "^ha.", '{"ha-mode":"all"}')
    web_cluster.mc.declare("ha.x", "hamq@node1")

    def mirrored():
        answer = web_cluster.request("GET", "api/queues/%2f/ha.x")
        queue = answer.body if answer.status == 200 else None
        if not queue or len(queue["synchronised_slave_nodes"]) != 2:
            return None
        # a just-added member has no node until its node's next heartbeat lists it
        return queue if None not in (queue["node"], *queue["slave_nodes"]) else None

    queue = wait_for(mirrored, PLACEMENT_TIMEOUT_S, "ha.x on three nodes")
    assert queue["policy"] == "ha-all"
    nodes = {queue["node"], *queue["slave_nodes"]}
    assert nodes == {"hamq@node1", "hamq@node2", "hamq@node3"}
    assert queue["lag"] == 0  # nobody consumes
    assert queue in web_cluster.get("api/queues")
    assert queue in web_cluster.get("api/queues/%2f")

    send_confirmed(web_cluster.namesrv, "ha.x", SENDS, "web")
    assert web_cluster.get("api/queues/%2f/ha.x")["messages"] == SENDS
    others_lag = web_cluster.get("api/overview")["queue_totals"]["lag"]  # other modules' groups
    with hamq.PullConsumer("web-lag", web_cluster.namesrv) as consumer:
        queues = consumer.fetch_message_queues("ha.x")
        for mq in queues:  # the first queue consumed to its end, the others not at all
            consumer.commit_offset(mq, consumer.max_offset(mq) if mq == queues[0] else 0)
        behind = SENDS - consumer.max_offset(queues[0])
    assert web_cluster.get("api/queues/%2f/ha.x")["lag"] == behind
    for action in ("sync", "cancel_sync"):
        answer = web_cluster.request("POST", "api/queues/%2f/ha.x/actions", {"action": action})
        assert answer.status == 204, answer

    # the sampler turns the brokers' counters into totals and rates
    overview = wait_for(
        lambda: (o := web_cluster.get("api/overview"))["message_stats"]["publish"] >= SENDS and o,
        15,
        "the sends counted in the overview",
    )
    assert overview["queue_totals"]["messages"] >= SENDS
    wait_for(
        lambda: web_cluster.get("api/overview")["queue_totals"]["lag"] == others_lag + behind,
        15,
        "the consumer group's lag sampled",
    )
    assert overview["node_count"] == 3
    assert overview["object_totals"]["groups"] >= 1
    # A rate needs two readings of the master: its first may already hold the first sends.
    send_confirmed(web_cluster.namesrv, "ha.x", SENDS, "again")

    def publish_rate_seen():
        history = web_cluster.get("api/history?age_s=60")
        topic = history["series"]["topics"].get("ha.x", {"publish_rate": []})
        return history if any(rate > 0 for _, rate in topic["publish_rate"]) else None

    assert wait_for(publish_rate_seen, 15, "a publish rate for ha.x")["interval_s"] == 2.0


def test_vhost_lifecycle(web_cluster):
    assert web_cluster.request("PUT", "api/vhosts/v1").status == 201
    assert web_cluster.request("PUT", "api/vhosts/v1").status == 204
    assert web_cluster.get("api/vhosts/v1") == {"name": "v1"}
    assert {"name": "v1"} in web_cluster.get("api/vhosts")
    body = {"pattern": "^two\\.", "definition": {"ha-mode": "exactly", "ha-params": 2}}
    assert web_cluster.request("PUT", "api/policies/v1/two", body).status == 201
    assert [p["name"] for p in web_cluster.get("api/policies/v1")] == ["two"]
    assert web_cluster.get("api/queues/v1") == []
    assert web_cluster.request("DELETE", "api/policies/v1/two").status == 204
    assert_error(web_cluster.request("DELETE", "api/policies/v1/two"), 404, None)
    assert web_cluster.request("DELETE", "api/vhosts/v1").status == 204
    assert_error(web_cluster.request("GET", "api/vhosts/v1"), 404, "vhost")
    assert_error(web_cluster.request("DELETE", "api/vhosts/v1"), 404, "vhost")


def test_nodes(web_cluster):
    nodes = web_cluster.get("api/nodes")
    assert [n["name"] for n in nodes] == ["hamq@node1", "hamq@node2", "hamq@node3"]
    assert all(n["running"] for n in nodes)


ALL = {"ha-mode": "all"}


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "field"),
    [
        (
            "PUT",
            "api/policies/%2f/p",
            {"pattern": ".", "definition": {"ha-mode": "exactly"}},
            400,
            "definition.ha-params",
        ),
        (
            "PUT",
            "api/policies/%2f/p",
            {"pattern": ".", "definition": {"ha-mode": "sometimes"}},
            400,
            "definition.ha-mode",
        ),
        (
            "PUT",
            "api/policies/%2f/p",
            {"pattern": ".", "definition": {**ALL, "ha-colour": "blue"}},
            400,
            "definition.ha-colour",
        ),
        (
            "PUT",
            "api/policies/%2f/p",
            {"pattern": ".", "definition": {**ALL, "ha-sync-batch-size": 0}},
            400,
            "definition.ha-sync-batch-size",
        ),
        ("PUT", "api/policies/%2f/p", {"pattern": ".", "definition": {}}, 400, "definition"),
        ("PUT", "api/policies/%2f/p", {"pattern": "(", "definition": ALL}, 400, "pattern"),
        (
            "PUT",
            "api/policies/%2f/p",
            {"pattern": ".", "definition": ALL, "apply-to": "exchanges"},
            400,
            "apply-to",
        ),
        (
            "PUT",
            "api/policies/%2f/p",
            {"pattern": ".", "definition": ALL, "priority": "high"},
            400,
            "priority",
        ),
        ("PUT", "api/policies/%2f/p", {"pattern": 5, "definition": ALL}, 400, "pattern"),
        ("PUT", "api/policies/%2f/p", {"pattern": "."}, 400, "definition"),
        ("PUT", "api/policies/%2f/p", {"pattern": ".", "definition": "all"}, 400, "definition"),
        ("PUT", "api/policies/%2f/p", [1, 2], 400, None),
        ("PUT", "api/policies/%2f/a%2Fb", {"pattern": ".", "definition": ALL}, 400, "name"),
        ("PUT", "api/policies/%2f/%20", {"pattern": ".", "definition": ALL}, 400, "name"),
        ("PUT", "api/policies/%2f/%20p", {"pattern": ".", "definition": ALL}, 400, "name"),
        ("PUT", "api/policies/nosuch/p", {"pattern": ".", "definition": ALL}, 404, "vhost"),
        ("PUT", "api/policies/a%20b/p", {"pattern": ".", "definition": ALL}, 400, "vhost"),
        ("GET", "api/policies/nosuch", None, 404, "vhost"),
        ("GET", "api/policies/%2f/nosuch", None, 404, None),
        ("DELETE", "api/policies/nosuch/p", None, 404, "vhost"),
        ("GET", "api/queues/nosuch", None, 404, "vhost"),
        ("GET", "api/queues/%2f/nosuch", None, 404, "name"),
        ("POST", "api/queues/%2f/nosuch/actions", {"action": "sync"}, 404, None),
        ("POST", "api/queues/%2f/ha.x/actions", {"action": "purge"}, 400, "action"),
        ("POST", "api/queues/%2f/a%25b/actions", {"action": "sync"}, 400, "name"),
        ("POST", "api/queues/nosuch/t/actions", {"action": "sync"}, 404, "vhost"),
        ("PUT", "api/vhosts/a%25b", None, 400, "vhost"),
        ("DELETE", "api/vhosts/%2f", None, 400, None),
        ("GET", "api/history?age_s=-1", None, 400, "age_s"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_field(web_cluster, method, path, body, status, field):
    assert_error(web_cluster.request(method, path, body), status, field)


@pytest.mark.parametrize(
    ("raw", "headers"),
    [
        (b'{"pattern":', {"content-type": "application/json"}),
        (b"pattern=.&definition=x", {"content-type": "application/x-www-form-urlencoded"}),
        (b"\xff\xfe", {}),
        (b"", {}),
    ],
)
def test_a_body_that_is_no_json_object_is_400(web_cluster, raw, headers):
    answer = web_cluster.request("PUT", "api/policies/%2f/p", raw=raw, headers=headers)
    assert_error(answer, 400, answer.body["field"], "INVALID_ARGUMENT")
    assert answer.body["reason"]


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_a_name_with_a_slash_is_addressed_whole(web_cluster, method):
    """Only vhost "/" holds a "/", so ``%2f/a%2Fb`` is vhost "/" and name "a/b" (a policy
    an older version stored so must stay deletable), not vhost "//a" and name "b"."""
    answer = web_cluster.request(method, "api/policies/%2f/a%2Fb")
    assert_error(answer, 404, None, "QUERY_NOT_FOUND")
    assert answer.body["reason"] == "policy 'a/b' in vhost '/' does not exist", answer.body


def test_unknown_route_and_method_answer_in_the_error_shape(web_cluster):
    assert_error(web_cluster.request("GET", "api/nope"), 404, None)
    answer = web_cluster.request("PATCH", "api/vhosts")
    assert answer.status == 405 and set(answer.body) == ERROR_KEYS, answer
    assert json.loads(json.dumps(web_cluster.get("api/openapi.json")))["openapi"].startswith("3.")
