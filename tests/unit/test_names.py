"""Names a client sends (topics, groups, brokers, clusters) are checked before they can
reach the file system or the route table: ``validate_name`` refuses what is not a safe
path component, and the store refuses to build a queue directory from anything else, even
when a caller skipped the protocol check (the store's own guarantee)."""

from __future__ import annotations

import pytest

from hamq.config import StoreConfig
from hamq.errors import InvalidArgument, MessageIllegal
from hamq.protocol.message import encode_batch, encode_message, validate_name, validate_topic
from hamq.store.message_store import MessageStore

UNSAFE = {
    "..": "directory reference",
    ".": "directory reference",
    "a\0b": "NUL",
    "a/b": "'/'",
    "a\\b": "'\\\\'",
    "": "empty",
    "tab\t": "'\\t'",
    "é": "'é'",
    "x" * 128: "more than the limit",
}


@pytest.mark.parametrize("name", list(UNSAFE), ids=range(len(UNSAFE)))
def test_unsafe_topic_names_are_message_illegal_naming_the_problem(name):
    with pytest.raises(MessageIllegal, match="topic") as caught:
        validate_topic(name)
    assert UNSAFE[name] in caught.value.message


@pytest.mark.parametrize("value", [5, None, ["g"], b"g"])
def test_names_must_be_strings(value):
    with pytest.raises(InvalidArgument, match="group must be a string"):
        validate_name(value, "group")


def test_rocketmq_names_stay_valid():
    for name in ("TopicTest", "%RETRY%group-1", "%DLQ%g_2", "orders.v1", "a|b", "..x"):
        assert validate_topic(name) == name.encode()


def test_store_never_builds_a_path_from_an_unsafe_topic(tmp_path):
    store = MessageStore(StoreConfig(store_dir=str(tmp_path / "store"), disk_min_free_bytes=1))
    try:
        payload, crc = encode_batch([encode_message(b"x")])
        for topic in ("..", ".", "../outside"):
            with pytest.raises(MessageIllegal):
                store.put_batch(topic, 0, payload, 1, crc, 0)
            with pytest.raises(MessageIllegal):
                store.delete_topic(topic)
        assert not (tmp_path / "outside").exists()
        assert (tmp_path / "store" / "commitlog").is_dir()
        assert store.put_batch("Fine", 0, payload, 1, crc, 0).base_queue_offset == 0
    finally:
        store.close()
