"""Clients in a vhost: the names they are given go on the wire as ``vhost%name`` (RocketMQ
5's namespace), the default vhost's as they are, and the names they give back are the
user's again. A consumer group's retry topic in a vhost is ``%RETRY%vhost%group``."""

from __future__ import annotations

import pytest

from hamq.client.consumer import AsyncPullConsumer
from hamq.client.core import ClientCore
from hamq.client.message import MessageExt, MessageQueue, user_name
from hamq.client.producer import AsyncProducer
from hamq.client.push import AsyncPushConsumer
from hamq.client.retry import retry_copy
from hamq.client.simple import AsyncSimpleConsumer, PopMessageExt
from hamq.policy.definition import PolicyError, split_wire_name
from hamq.protocol.message import decode_records
from hamq.protocol.properties import PROPERTY_RETRY_TOPIC, RETRY_GROUP_TOPIC_PREFIX
from unit.test_message_codec import make_record

NAMESRV = "127.0.0.1:9"  # never dialled: these tests open no connection


def consumed(topic: str, props: dict[str, str] | None = None) -> MessageExt:
    """A message as a consumer decodes it from a record stored under ``topic``."""
    return decode_records(make_record([b"x"], topic=topic, props=props), 0, MessageExt, "b")[0]


@pytest.mark.parametrize(
    ("vhost", "name", "wire"),
    [("/", "orders", "orders"), ("v1", "orders", "v1%orders"), ("v.2-x", "a%b", "v.2-x%a%b")],
)
def test_core_wraps_and_unwraps_names(vhost, name, wire):
    core = ClientCore(NAMESRV, vhost=vhost)
    assert core.wire(name) == wire
    assert core.user(wire) == name
    mq = MessageQueue(name, "broker-a", 1)
    assert core.wire_queue(mq) == MessageQueue(wire, "broker-a", 1)
    assert core.user_queue(core.wire_queue(mq)) == mq


def test_default_vhost_gives_back_the_same_queue_object():
    """No object per send in ``/``: the send result's queue is the route's own."""
    core = ClientCore(NAMESRV)
    mq = MessageQueue("orders", "broker-a", 0)
    assert core.wire_queue(mq) is mq and core.user_queue(mq) is mq


@pytest.mark.parametrize("vhost", ["", "a b", "x%y", "v" * 65, "../v"])
def test_a_bad_vhost_is_refused_when_the_client_is_made(vhost):
    with pytest.raises(PolicyError, match="vhost"):
        ClientCore(NAMESRV, vhost=vhost)


def test_every_client_puts_its_group_and_topics_on_the_wire_in_its_vhost():
    producer = AsyncProducer(NAMESRV, group="pg", vhost="v1")
    assert producer.group == "v1%pg"
    assert producer._wire("t", MessageQueue("t", "b", 2)) == ("v1%t", MessageQueue("v1%t", "b", 2))
    assert AsyncPullConsumer("g", NAMESRV, vhost="v1").group == "v1%g"
    simple = AsyncSimpleConsumer("g", NAMESRV, {"t": "*"}, vhost="v1")
    assert (simple.group, list(simple.filters)) == ("v1%g", ["v1%t"])
    push = AsyncPushConsumer("g", NAMESRV, vhost="v1")
    push.subscribe("t")
    assert (push.group, push.puller.group, list(push.subscriptions)) == ("v1%g", "v1%g", ["v1%t"])
    default = AsyncPushConsumer("g", NAMESRV)
    default.subscribe("t")
    assert (default.group, list(default.subscriptions)) == ("g", ["t"])


def test_retry_topic_of_a_group_in_a_vhost_is_rocketmqs():
    """'%' in a wire name does not confuse the retry prefix: the copy goes to
    ``%RETRY%v1%g``, keeps the original's wire topic, and reads back as the user's."""
    push = AsyncPushConsumer("g", NAMESRV, vhost="v1")
    original = consumed("v1%orders")
    assert original.topic == "orders"
    copy = retry_copy(original, push.puller.group, max_reconsume_times=16)
    assert copy.topic == RETRY_GROUP_TOPIC_PREFIX + "v1%g" == "%RETRY%v1%g"
    assert copy.properties[PROPERTY_RETRY_TOPIC] == "v1%orders"
    assert split_wire_name(copy.topic) == ("v1", "%RETRY%g")
    redelivered = consumed(copy.topic, props=copy.properties)
    assert redelivered.topic == "orders"
    assert redelivered.queue.topic == "%RETRY%v1%g"  # where acks and offsets go


def test_a_received_pop_message_names_its_topic_in_the_vhost_and_acks_on_the_wire():
    """A simple consumer in ``v1`` hands out ``orders``, not ``v1%orders``; its receipt
    handle (and so its ack) still names the stored topic."""
    popped = decode_records(make_record([b"x"], topic="v1%orders"), 0, PopMessageExt, "b")[0]
    popped.ck = "ck"
    assert popped.topic == "orders"
    assert popped.wire_topic == "v1%orders" == popped.queue.topic
    assert popped.receipt_handle.split()[0] == "v1%orders"


@pytest.mark.parametrize(
    ("wire", "user"),
    [
        ("orders", "orders"),
        ("v1%orders", "orders"),
        ("%RETRY%g", "%RETRY%g"),
        ("%RETRY%v1%g", "%RETRY%g"),
        ("a|b%c", "a|b%c"),  # 'a|b' is no vhost name: the name is its own
    ],
)
def test_user_name(wire, user):
    assert user_name(wire) == user
