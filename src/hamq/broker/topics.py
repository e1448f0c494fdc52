"""Topic administration on a broker: create, update, delete, validate access."""

from __future__ import annotations

from collections.abc import Callable

from hamq.broker.pop.revive_log import REVIVE_LOG_TOPIC
from hamq.broker.role import RoleState
from hamq.broker.schedule.service import SCHEDULE_TOPIC
from hamq.broker.transaction.service import HALF_TOPIC, OP_HALF_TOPIC
from hamq.errors import InvalidArgument, NoPermission, QueueNotExist, TopicNotExist
from hamq.namesrv.routes import AUTO_CREATE_TOPIC_KEY_TOPIC
from hamq.protocol.frame import optional
from hamq.protocol.limits import MAX_QUEUE_NUMS
from hamq.protocol.message import validate_topic
from hamq.store.message_store import MessageStore
from hamq.store.metadata import PERM_READ, PERM_READ_WRITE, PERM_WRITE, TopicConfig

# Topics the broker writes and reads itself: a record a client put there could stop a
# restart or a service (RocketMQ's TopicValidator.isSystemTopic, by name and by prefix).
SYSTEM_TOPICS = frozenset(
    {AUTO_CREATE_TOPIC_KEY_TOPIC, SCHEDULE_TOPIC, HALF_TOPIC, OP_HALF_TOPIC, REVIVE_LOG_TOPIC}
)
SYSTEM_TOPIC_PREFIXES = ("rmq_sys_", "RMQ_SYS_")


def is_system_topic(topic: str) -> bool:
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIXES)


def client_topic(topic: object) -> str:
    """A topic a client asks to create, change, delete or write: a valid name that is not
    a system topic (refused with NO_PERMISSION, as RocketMQ does)."""
    validate_topic(topic)
    if is_system_topic(topic):
        raise NoPermission(
            f"topic {topic!r} is a system topic: clients cannot create, change, delete or write it"
        )
    return topic


def topic_args(ext: dict, default_queue_nums: int) -> tuple[str, int, int, int]:
    """The fields of an UPDATE_AND_CREATE_TOPIC request, checked."""
    return (
        client_topic(ext.get("topic")),
        optional(ext, "read_queue_nums", default_queue_nums, 1, MAX_QUEUE_NUMS),
        optional(ext, "write_queue_nums", default_queue_nums, 1, MAX_QUEUE_NUMS),
        optional(ext, "perm", PERM_READ_WRITE, 0, PERM_READ_WRITE),
    )


class TopicService:
    def __init__(
        self,
        store: MessageStore,
        role: RoleState,
        *,
        default_queue_nums: int,
        auto_create: bool,
        on_change: Callable[[], None],
    ) -> None:
        self.store = store
        self.role = role  # slaves take topics from their master, never from admins
        self.default_queue_nums = default_queue_nums
        self.auto_create = auto_create
        self.on_change = on_change  # re-register with the name servers
        self.on_delete: list[Callable[[str], None]] = []  # state kept per topic elsewhere
        if auto_create and role.is_master and store.topics.get(AUTO_CREATE_TOPIC_KEY_TOPIC) is None:
            self.create(
                AUTO_CREATE_TOPIC_KEY_TOPIC,
                default_queue_nums,
                default_queue_nums,
                PERM_READ_WRITE,
                notify=False,
            )

    def create(
        self,
        topic: str,
        read_queue_nums: int,
        write_queue_nums: int,
        perm: int,
        notify: bool = True,
    ) -> TopicConfig:
        if not self.role.is_master:
            raise NoPermission("this broker is a slave: create topics on the group's master")
        return self.install(self.build(topic, read_queue_nums, write_queue_nums, perm), notify)

    @staticmethod
    def build(topic: str, read_queue_nums: int, write_queue_nums: int, perm: int) -> TopicConfig:
        """A checked topic config (DLedger replicates it before any member installs it)."""
        validate_topic(topic)
        for name, n in (
            ("read_queue_nums", read_queue_nums),
            ("write_queue_nums", write_queue_nums),
        ):
            if not 1 <= n <= MAX_QUEUE_NUMS:
                raise InvalidArgument(f"{name} must be in 1..{MAX_QUEUE_NUMS}, got {n}")
        if perm & ~PERM_READ_WRITE:
            raise InvalidArgument(
                f"perm must combine {PERM_READ} (read) and {PERM_WRITE} (write), got {perm}"
            )
        return TopicConfig(topic, read_queue_nums, write_queue_nums, perm)

    def install(self, config: TopicConfig, notify: bool = True) -> TopicConfig:
        for queue_id in range(max(config.read_queue_nums, config.write_queue_nums)):
            self.store.create_queue(config.topic_name, queue_id)
        self.store.topics.put(config, self.store.clock_ms())
        if notify:
            self.on_change()
        return config

    def delete(self, topic: str) -> None:
        if not self.role.is_master:
            raise NoPermission("this broker is a slave: delete topics on the group's master")
        self.remove(topic)

    def remove(self, topic: str) -> None:
        if not self.store.topics.delete(topic, self.store.clock_ms()):
            raise TopicNotExist(f"topic {topic!r} does not exist on this broker")
        self.store.delete_topic(topic)
        for forget in self.on_delete:
            forget(topic)
        self.on_change()

    def for_write(self, topic: str, queue_id: int) -> TopicConfig:
        """A client's send: the topic must exist (or be auto-created), be writable and not
        be a system topic."""
        if not self.role.is_master:
            raise NoPermission(
                "this broker is a slave and does not accept writes; send to the group's master"
            )
        config = self.store.topics.get(topic)
        if config is None or is_system_topic(topic):
            client_topic(topic)
            if not self.auto_create:
                raise TopicNotExist(
                    f"topic {topic!r} does not exist (create it first, or "
                    "enable auto_create_topic_enable on the broker)"
                )
            config = self.create(
                topic, self.default_queue_nums, self.default_queue_nums, PERM_READ_WRITE
            )
        if not config.perm & PERM_WRITE:
            raise NoPermission(f"topic {topic!r} is not writable on this broker")
        if not 0 <= queue_id < config.write_queue_nums:
            raise QueueNotExist(
                f"topic {topic!r} has write queues 0..{config.write_queue_nums - 1}"
                f"; queue {queue_id} does not exist"
            )
        return config

    def replace_all(self, configs: dict[str, TopicConfig]) -> None:
        """Slave side: take the master's topic table (SlaveSynchronize)."""
        now = self.store.clock_ms()
        for name in set(self.store.topics.topics) - set(configs):
            self.store.topics.delete(name, now)
        for name, config in configs.items():
            if self.store.topics.get(name) != config:
                self.store.topics.put(config, now)

    def for_read(self, topic: str, queue_id: int) -> TopicConfig:
        config = self.store.topics.get(topic)
        if config is None and not self.role.is_master and (topic, queue_id) in self.store.queues:
            # Replicated data of a topic whose config has not been synced from the master
            # yet (it may never be, if the master just died): what is here is readable.
            return TopicConfig(topic, queue_id + 1, 0, PERM_READ)
        if config is None:
            raise TopicNotExist(f"topic {topic!r} does not exist on this broker")
        if not config.perm & PERM_READ:
            raise NoPermission(f"topic {topic!r} is not readable on this broker")
        if not 0 <= queue_id < config.read_queue_nums:
            raise QueueNotExist(
                f"topic {topic!r} has read queues 0..{config.read_queue_nums - 1}"
                f"; queue {queue_id} does not exist"
            )
        return config
