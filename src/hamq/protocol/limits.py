"""Every protocol limit, named, with the reason for its value."""

# A frame carries at most one batch plus its header; 16 MiB leaves room for a
# MAX_BATCH_BYTES batch and a pull response of several batches.
MAX_FRAME_BYTES = 16 * 1024 * 1024
# Header is msgpack of a handful of scalars and short strings; anything bigger is garbage.
MAX_HEADER_BYTES = 64 * 1024
# RocketMQ's maxMessageSize default is 4 MiB.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# One send request may carry at most this many bytes of messages (RocketMQ: 4 MiB per
# batch as a whole; we allow more so batched sends amortise round trips).
MAX_BATCH_BYTES = 8 * 1024 * 1024
# And at most this many messages, so per-batch index work stays bounded.
MAX_BATCH_MESSAGES = 4096
# Properties of one message (keys, tags, user properties) as encoded bytes.
MAX_PROPERTIES_BYTES = 32 * 1024
# Topic names as in RocketMQ (TopicValidator: 127 characters).
MAX_TOPIC_LENGTH = 127
# Group, broker and cluster names (RocketMQ's Validators.CHARACTER_MAX_LENGTH).
MAX_NAME_LENGTH = 255
# HOST:PORT strings a peer hands us (a DNS name is at most 253 characters).
MAX_ADDRESS_LENGTH = 255
# Queues per topic and broker group; more is a typo or an attack (a client allocates one
# queue object per queue it sees in a route).
MAX_QUEUE_NUMS = 1024
# Broker ids are small (0 = master, slaves and DLedger members count up from 1).
MAX_BROKER_ID = 1023
# Offsets and timestamps on the wire are signed 64-bit, as in RocketMQ; bigger values
# could not be stored in a record header or a consume queue entry.
INT64_MAX = 2**63 - 1
# Pull responses stop adding batches past this many bytes.
MAX_PULL_BYTES = 4 * 1024 * 1024
# Requests a client keeps outstanding on one connection before send() waits.
MAX_INFLIGHT_REQUESTS = 4096
# Groups one HEART_BEAT may name (a client process rarely has more than a few).
MAX_HEARTBEAT_GROUPS = 1024
# Queues one LOCK_BATCH_MQ / UNLOCK_BATCH_MQ may name: an orderly consumer locks the queues
# of its topics on one broker group (MAX_QUEUE_NUMS per topic); 100k per request kept
# ~30 MB of locks per request.
MAX_LOCK_BATCH_QUEUES = 4096
