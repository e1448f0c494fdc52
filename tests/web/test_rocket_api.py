"""The RocketMQ-shaped routes of the management API against a real three-node cluster: the
cluster and its broker group (roles, epochs, SyncStateSet, confirm offset) and electing its
master, a declared topic's route and offsets, messages looked up by id, key and queue
offset, a consumer group's members and lag and resetting its offset, creating and deleting
topics; and bad input, always a 4xx error body naming the field and the wire code, never
a 500.

One topic (``rk.orders``, two copies by its policy) serves the module; the election runs
last, since it moves the group's master."""

from __future__ import annotations

import pytest
from mirrored_cluster import send_confirmed

import hamq
from hamq import ConsumeConcurrentlyStatus
from helpers import wait_for
from push_consumers import start_consumer

TOPIC = "rk.orders"
GROUP = "rk-readers"
SENDS = 12
PLACEMENT_TIMEOUT_S = 30.0
ERROR_KEYS = {"error", "reason", "code", "name", "field"}


def assert_error(answer, status: int, name: str, field: str | None = None) -> dict:
    assert answer.status == status, answer
    assert set(answer.body) == ERROR_KEYS, answer.body
    assert (answer.body["name"], answer.body["field"]) == (name, field), answer.body
    return answer.body


@pytest.fixture(scope="module")
def placed(web_cluster):
    """``rk.orders`` on two nodes, holding SENDS keyed messages and one binary body: the
    group's name and the send results."""
    mc = web_cluster.mc
    mc.admin("set-policy", "rk-two", r"^rk\.", '{"ha-mode":"exactly","ha-params":2}')
    mc.declare(TOPIC, "hamq@node1")
    mc.placed(
        TOPIC,
        lambda row: row["pid"] is not None and len(row["synchronised_slave_pids"]) == 1,
        "a master and a synchronised mirror",
    )
    send_confirmed(web_cluster.namesrv, TOPIC, SENDS - 1, "rk")
    with hamq.Producer(web_cluster.namesrv) as producer:
        keyed = producer.send(hamq.Message(TOPIC, b"\xff\x00", keys="order-7", tags="bin"))
    (group,) = [q["broker_name"] for q in web_cluster.get(f"api/topics/{TOPIC}")["queue_datas"]]
    return group, keyed


def test_clusters_and_the_groups_sync_state(web_cluster, placed):
    group_name, _ = placed
    (cluster,) = web_cluster.get("api/clusters")
    (listed,) = [g for g in cluster["groups"] if g["broker_name"] == group_name]
    assert sorted(m["role"] for m in listed["members"]) == ["master", "slave"]
    assert cluster["cluster_name"] == "hamq"

    def confirmed() -> dict | None:
        # The controller learns a member's confirm offset from its next heartbeat (300 ms)
        group = web_cluster.get(f"api/groups/{group_name}")
        return group if group["confirm_offset"] else None

    group = wait_for(confirmed, 10.0, "the controller to hear the sends' confirm offset")
    assert group in web_cluster.get("api/groups")
    assert group["mode"] == "controller"
    assert group["master_epoch"] >= 1 and group["sync_state_set_epoch"] >= 1
    master = next(m for m in group["members"] if m["role"] == "master")
    assert (master["broker_id"], master["addr"]) == (group["master_id"], group["master_addr"])
    assert sorted(group["sync_state_set"]) == sorted(m["broker_id"] for m in group["members"])
    assert all(m["alive"] and m["in_sync"] and m["error"] is None for m in group["members"])
    assert group["confirm_offset"] == master["confirm_offset"] > 0  # the sends are confirmed

    assert_error(web_cluster.request("GET", "api/groups/nope"), 404, "BROKER_NOT_FOUND")
    assert_error(
        web_cluster.request("GET", "api/groups/a%20b"), 400, "INVALID_ARGUMENT", "broker_name"
    )


def test_topic_list_route_and_offsets(web_cluster, placed):
    group_name, _ = placed
    kinds = {t["name"]: t["kind"] for t in web_cluster.get("api/topics")}
    assert kinds[TOPIC] == "normal" and kinds["rmq_sys_REVIVE_LOG"] == "system"
    topic = web_cluster.get(f"api/topics/{TOPIC}")
    assert (topic["name"], topic["vhost"]) == (TOPIC, "/")
    assert [b["broker_name"] for b in topic["broker_datas"]] == [group_name]
    assert sum(q["max_offset"] - q["min_offset"] for q in topic["queues"]) == SENDS

    assert_error(web_cluster.request("GET", "api/topics/nope"), 404, "TOPIC_NOT_EXIST")
    assert_error(web_cluster.request("GET", "api/topics/a%20b"), 400, "INVALID_ARGUMENT", "topic")
    assert_error(
        web_cluster.request("GET", "api/topics?vhost=a%25b"), 400, "INVALID_ARGUMENT", "vhost"
    )
    unknown = web_cluster.request("GET", "api/topics?vhost=v9")
    assert_error(unknown, 404, "QUERY_NOT_FOUND", "vhost")  # as on /api/queues/v9


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"read_queues": 0}, "read_queues"),
        ({"write_queues": "many"}, "write_queues"),
        ({"perm": 5}, "perm"),
        ({"queues": 4}, "queues"),  # not a field: a typo is refused, not ignored
    ],
)
def test_put_topic_bad_body_names_the_field(web_cluster, body, field):
    answer = web_cluster.request("PUT", "api/topics/rk.bad", body)
    assert_error(answer, 400, "INVALID_ARGUMENT", field)


def test_put_topic_declares_it_where_nodes_place_topics(web_cluster, placed):
    """This cluster's controller places topics on nodes, and collects one created on the
    masters alone within a round: the PUT declares the topic through the node named (as
    ``hamq admin declare-topic --node``) and answers once it is placed and routed."""
    body = {"read_queues": 2, "node": "hamq@node2"}
    created = web_cluster.request("PUT", "api/topics/plain.t", body)
    assert created.status == 200, created
    (group,) = created.body["brokers"]
    assert created.body == {
        "name": "plain.t",
        "vhost": "/",
        "brokers": [group],
        "node": body["node"],
    }
    queue = web_cluster.get("api/queues/%2f/plain.t")  # declared: the controller keeps it
    assert (queue["node"], queue["broker_name"], queue["policy"]) == (body["node"], group, None)
    (queue_data,) = web_cluster.get("api/topics/plain.t")["queue_datas"]
    assert (queue_data["broker_name"], queue_data["read_queue_nums"]) == (group, 2)
    assert web_cluster.request("PUT", "api/topics/plain.t", body).body == created.body  # alike

    for refused, field in (
        ({"node": "hamq@nope"}, "node"),
        ({"read_queues": 2, "write_queues": 3}, "write_queues"),
        ({"perm": 4}, "perm"),
        ({"cluster": "hamq"}, "cluster"),
    ):
        answer = web_cluster.request("PUT", "api/topics/plain.u", refused)
        assert_error(answer, 400, "INVALID_ARGUMENT", field)


def test_message_by_id_key_and_queue_offset(web_cluster, placed):
    _, keyed = placed
    by_id = web_cluster.get(f"api/messages/{TOPIC}/{keyed.msg_id}")["messages"]
    (found,) = by_id
    assert (found["msg_id"], found["keys"], found["tags"]) == (keyed.msg_id, "order-7", "bin")
    assert (found["body"], found["body_encoding"]) == ("/wA=", "base64")
    assert found["queue_offset"] == keyed.queue_offset

    by_key = web_cluster.get(f"api/messages/{TOPIC}?key=order-7")
    assert by_key == {"messages": by_id, "truncated": False}
    where = f"broker_name={keyed.queue.broker_name}&queue_id={keyed.queue.queue_id}"
    assert web_cluster.get(f"api/messages/{TOPIC}?{where}&offset={keyed.queue_offset}") == {
        "messages": by_id,
        "truncated": False,
    }
    assert web_cluster.get(f"api/messages/{TOPIC}?key=nobody")["messages"] == []

    past = web_cluster.request("GET", f"api/messages/{TOPIC}?{where}&offset=100000")
    assert_error(past, 404, "QUERY_NOT_FOUND")
    beyond = f"{2**40:016X}{0:08X}"  # a well-formed id past the end of the commit log
    unknown_id = web_cluster.request("GET", f"api/messages/{TOPIC}/{beyond}")
    assert_error(unknown_id, 404, "QUERY_NOT_FOUND")
    bad_id = web_cluster.request("GET", f"api/messages/{TOPIC}/xyz")
    assert_error(bad_id, 400, "INVALID_ARGUMENT", "msg_id")
    half = web_cluster.request("GET", f"api/messages/{TOPIC}?queue_id=0&offset=0")
    assert_error(half, 400, "INVALID_ARGUMENT", "broker_name")
    negative = web_cluster.request("GET", f"api/messages/{TOPIC}?{where}&offset=-1")
    assert_error(negative, 400, "INVALID_ARGUMENT", "offset")
    assert_error(web_cluster.request("GET", "api/messages/nope?key=k"), 404, "TOPIC_NOT_EXIST")


def test_consumer_group_members_lag_and_offset_reset(web_cluster, placed):
    group_name, _ = placed
    consumer = start_consumer(
        web_cluster.namesrv,
        GROUP,
        TOPIC,
        lambda messages: ConsumeConcurrentlyStatus.CONSUME_SUCCESS,
    )
    try:
        caught_up = wait_for(
            lambda: (
                (g := web_cluster.request("GET", f"api/consumer-groups/{GROUP}")).status == 200
                and g.body["members"]
                and sum(q["consumer_offset"] for q in g.body["queues"]) == SENDS
                and g.body
            ),
            20,
            "the consumer's commits seen",
        )
        assert caught_up["total_lag"] == 0
        assert {q["broker_name"] for q in caught_up["queues"]} == {group_name}
        assert {"name": GROUP} in web_cluster.get("api/consumer-groups")

        reset = {"action": "reset_offset", "topic": TOPIC, "timestamp_ms": 0}
        done = web_cluster.request("POST", f"api/consumer-groups/{GROUP}/actions", reset)
        assert done.status == 200, done
        assert (done.body["group"], done.body["topic"]) == (GROUP, TOPIC)
        assert sum((q["old_offset"] or 0) - q["new_offset"] for q in done.body["queues"]) == SENDS
    finally:
        consumer.shutdown()

    assert_error(web_cluster.request("GET", "api/consumer-groups/nobody"), 404, "QUERY_NOT_FOUND")
    for body, field in (
        ({"action": "reset_offset", "topic": TOPIC}, "timestamp_ms"),
        ({"action": "rewind", "topic": TOPIC, "timestamp_ms": 0}, "action"),
        ({"action": "reset_offset", "topic": "a b", "timestamp_ms": 0}, "topic"),
    ):
        answer = web_cluster.request("POST", f"api/consumer-groups/{GROUP}/actions", body)
        assert_error(answer, 400, "INVALID_ARGUMENT", field)
    unknown = {"action": "reset_offset", "topic": "nope", "timestamp_ms": 0}
    answer = web_cluster.request("POST", f"api/consumer-groups/{GROUP}/actions", unknown)
    assert_error(answer, 404, "TOPIC_NOT_EXIST")


def test_elect_master_moves_the_master(web_cluster, placed):
    group_name, _ = placed
    actions = f"api/groups/{group_name}/actions"
    group = web_cluster.get(f"api/groups/{group_name}")
    (slave,) = [m["broker_id"] for m in group["members"] if m["role"] == "slave"]

    elected = web_cluster.request("POST", actions, {"action": "elect_master", "broker_id": slave})
    assert elected.status == 200, elected
    assert elected.body["master_id"] == slave
    assert elected.body["master_epoch"] > group["master_epoch"]

    # the controller refuses a member it cannot elect: the group's state is in the way
    stranger = web_cluster.request("POST", actions, {"action": "elect_master", "broker_id": 99})
    assert stranger.status == 409, stranger
    assert set(stranger.body) == ERROR_KEYS and stranger.body["name"].startswith("CONTROLLER_")
    assert stranger.body["field"] == "broker_id"
    for body, field in (
        ({"action": "elect_master", "broker_id": "one"}, "broker_id"),
        ({"action": "promote", "broker_id": 1}, "action"),
        ({"action": "elect_master"}, "broker_id"),
    ):
        assert_error(web_cluster.request("POST", actions, body), 400, "INVALID_ARGUMENT", field)
    nope = {"action": "elect_master", "broker_id": 1}
    assert_error(
        web_cluster.request("POST", "api/groups/nope/actions", nope), 404, "BROKER_NOT_FOUND"
    )


def test_delete_declared_topic(web_cluster, placed):
    """A declared topic goes through the controller, which deletes it from its group."""
    assert web_cluster.request("DELETE", f"api/topics/{TOPIC}").status == 204
    wait_for(
        lambda: web_cluster.request("GET", f"api/topics/{TOPIC}").status == 404,
        PLACEMENT_TIMEOUT_S,
        f"{TOPIC} unrouted",
    )
    assert_error(web_cluster.request("DELETE", f"api/topics/{TOPIC}"), 404, "TOPIC_NOT_EXIST")
