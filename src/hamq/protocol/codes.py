"""Request and response codes, named (and where possible numbered) after RocketMQ's
``RequestCode`` / ``ResponseCode`` so its users recognise them on the wire and in logs."""

from enum import IntEnum


class RequestCode(IntEnum):
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12  # by key: a bounded scan of the topic's queues (broker/message_lookup.py)
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    UPDATE_BROKER_CONFIG = 25  # hamq: the alarm limits only (broker/alarms.py)
    GET_ALL_TOPIC_CONFIG = 21
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33  # the commit-log record at a msg id's physical offset
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39  # broker -> producer, oneway
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201  # hamq: the consumer groups connected now
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    RESET_CONSUMER_CLIENT_OFFSET = 220  # broker -> consumer, oneway: offsets were reset
    INVOKE_BROKER_TO_RESET_OFFSET = 222  # admin -> master: reset a group's offsets by time
    SEND_BATCH_MESSAGE = 320
    # pop consumption (RocketMQ 5 numbers)
    POP_MESSAGE = 200050
    ACK_MESSAGE = 200051
    CHANGE_MESSAGE_INVISIBLETIME = 200053
    BATCH_ACK_MESSAGE = 200151
    GET_BROKER_MEMBER_GROUP = 901
    BROKER_HEARTBEAT = 904
    NOTIFY_MIN_BROKER_ID_CHANGE = 905  # name server -> members: the group's membership changed
    ADD_BROKER = 902  # to a broker container: host one more member
    REMOVE_BROKER = 903  # to a broker container: stop and drop a member
    EXCHANGE_BROKER_HA_INFO = 910  # pre-online: a returning master announces itself to a slave
    GET_POP_CHECKPOINT = 911  # pre-online: a member's pop state, to merge by DataVersion
    GET_TRANSACTION_DECISIONS = 913  # pre-online: half messages an acting member decided
    POP_ESCAPED_REVIVE = 912  # an acting master's pop CK/ACK record, into another group's master
    POP_ESCAPED_CONFIRM = 914  # chosen master -> the record's group: did you put this record?
    PUT_TRANSACTION_DECISIONS = 915  # an acting master's decisions, to its group's members
    # mirrored-queue policies (seed 003)
    SYNC_QUEUE = 920  # to a group's master: copy the history to its unsynchronised mirrors, or stop
    GET_MIRROR_STATUS = 921  # to a group's master: each member's log start, acks, synchronised
    CONNECTION_BLOCKED = 922  # broker -> producer, oneway: a memory or disk alarm holds sends
    CONNECTION_UNBLOCKED = 923  # broker -> producer, oneway: the alarm cleared
    DECLARE_TOPIC = 924  # client -> node (container): declare a topic homed on this node
    UNDECLARE_TOPIC = 925  # client -> node (container): delete a topic declared there
    # controller mode (seed 001), RocketMQ 5's numbers
    CONTROLLER_ALTER_SYNC_STATE_SET = 1001
    CONTROLLER_ELECT_MASTER = 1002
    CONTROLLER_REGISTER_BROKER = 1003
    CONTROLLER_GET_REPLICA_INFO = 1004
    CONTROLLER_GET_METADATA_INFO = 1005
    CONTROLLER_GET_SYNC_STATE_DATA = 1006
    NOTIFY_BROKER_ROLE_CHANGED = 1008  # controller -> member, oneway
    CLEAN_BROKER_DATA = 1011
    CONTROLLER_GET_NEXT_BROKER_ID = 1012
    CONTROLLER_APPLY_BROKER_ID = 1013
    # hamq's own: a member's heartbeat to the controller (epoch, max offset, confirm offset)
    CONTROLLER_BROKER_HEARTBEAT = 1020
    # hamq's own: Raft traffic between controller peers
    CONTROLLER_RAFT_MESSAGE = 1021
    # hamq's own: vhosts, policies, declared topics and nodes in the controller's state (seed 003)
    CONTROLLER_ADD_VHOST = 1030
    CONTROLLER_DELETE_VHOST = 1031
    CONTROLLER_LIST_VHOSTS = 1032
    CONTROLLER_SET_POLICY = 1033
    CONTROLLER_CLEAR_POLICY = 1034
    CONTROLLER_LIST_POLICIES = 1035
    CONTROLLER_DECLARE_TOPIC = 1036
    CONTROLLER_DELETE_TOPIC = 1037
    CONTROLLER_LIST_TOPICS = 1038
    CONTROLLER_REGISTER_NODE = 1039
    CONTROLLER_NODE_HEARTBEAT = 1040  # node -> every controller peer, oneway
    CONTROLLER_LIST_NODES = 1041
    CONTROLLER_BROKER_SHUTDOWN = 1042  # member -> every peer: a clean shutdown, not a failure
    CONTROLLER_GET_PLACEMENT = 1043
    # hamq's own: master-slave HA transfer (RocketMQ uses a raw socket protocol for it)
    HA_HANDSHAKE = 1200
    HA_TRANSFER = 1201
    HA_ACK = 1202
    # hamq's own: DLedger (Raft) traffic between a group's members, and admin elect
    DLEDGER_MESSAGE = 1300
    DLEDGER_TRANSFER_LEADERSHIP = 1301


class ResponseCode(IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    IN_SYNC_REPLICAS_NOT_ENOUGH = 214
    # hamq's own codes start at 1000 (RocketMQ has no equivalent).
    BAD_FRAME = 1000
    INVALID_ARGUMENT = 1001
    DISK_FULL = 1002
    CRC_MISMATCH = 1003
    QUEUE_NOT_EXIST = 1004
    BROKER_NOT_FOUND = 1005
    NOT_LEADER = 1007  # DLedger: only the group's leader takes writes; the remark names it
    # a conditional send (ext expected_queue_offset) found the queue elsewhere; ext end_offset
    QUEUE_OFFSET_MISMATCH = 1008
    TRANSACTION_ROLLED_BACK = 1009  # END_TRANSACTION COMMIT of a half already rolled back
    TRANSACTION_COMMITTED = 1010  # END_TRANSACTION ROLLBACK of a half already committed
    # controller mode: RocketMQ's CONTROLLER_* codes (hamq.controller.errors.ControllerCode)
    CONTROLLER_FENCED_MASTER_EPOCH = 2000
    CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH = 2001
    CONTROLLER_INVALID_MASTER = 2002
    CONTROLLER_INVALID_REPLICAS = 2003
    CONTROLLER_MASTER_NOT_AVAILABLE = 2004
    CONTROLLER_INVALID_REQUEST = 2005
    CONTROLLER_BROKER_NOT_ALIVE = 2006
    CONTROLLER_NOT_LEADER = 2007  # ext "leader_addr" names the leader when known
    CONTROLLER_BROKER_METADATA_NOT_EXIST = 2008
    CONTROLLER_INVALID_CLEAN_BROKER_METADATA = 2009
    CONTROLLER_BROKER_NEED_TO_BE_REGISTERED = 2010
    CONTROLLER_MASTER_STILL_EXIST = 2011
    CONTROLLER_ELECT_MASTER_FAILED = 2012
    CONTROLLER_ALTER_SYNC_STATE_SET_FAILED = 2013
    CONTROLLER_BROKER_ID_INVALID = 2014


class Flag:
    """Bits of the frame header's ``flags`` field."""

    RESPONSE = 1
    ONEWAY = 2
