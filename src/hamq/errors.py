"""One small error hierarchy shared by servers and clients.

Each class maps to a wire ``ResponseCode``; the client raises the class that matches the
code it received, and its retry logic reads ``retriable`` / ``refresh_route`` instead of
matching strings (aiokafka's ``errors.py`` idea).
"""

from __future__ import annotations

from hamq.protocol.codes import ResponseCode


class HamqError(Exception):
    code: ResponseCode = ResponseCode.SYSTEM_ERROR
    retriable: bool = False
    refresh_route: bool = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.__class__.__name__)
        self.message = message or self.__class__.__name__

    @staticmethod
    def for_code(code: int, remark: str = "", ext: dict | None = None) -> HamqError:
        """The error an answer's code stands for (``ext``: the answer's fields, which
        some errors carry, e.g. ``QueueOffsetMismatch.end_offset``)."""
        cls = _BY_CODE.get(code, BrokerSystemError)
        err = cls(remark or f"broker answered code {code}")
        if isinstance(err, QueueOffsetMismatch) and ext is not None:
            err.end_offset = int(ext.get("end_offset", -1))
        if issubclass(cls, ControllerRefused):
            err.code = ResponseCode(code)  # one class stands for several CONTROLLER_* codes
        if cls is BrokerSystemError and code != ResponseCode.SYSTEM_ERROR:
            err.message = f"code {code}: {err.message}"
        return err


class BrokerSystemError(HamqError):
    code = ResponseCode.SYSTEM_ERROR


class SystemBusy(HamqError):
    code = ResponseCode.SYSTEM_BUSY
    retriable = True


class RequestCodeNotSupported(HamqError):
    code = ResponseCode.REQUEST_CODE_NOT_SUPPORTED


class MessageIllegal(HamqError):
    code = ResponseCode.MESSAGE_ILLEGAL


class ServiceNotAvailable(HamqError):
    code = ResponseCode.SERVICE_NOT_AVAILABLE
    retriable = True
    refresh_route = True


class NoPermission(HamqError):
    code = ResponseCode.NO_PERMISSION
    retriable = True
    refresh_route = True


class TopicNotExist(HamqError):
    code = ResponseCode.TOPIC_NOT_EXIST
    refresh_route = True


class TopicExistAlready(HamqError):
    code = ResponseCode.TOPIC_EXIST_ALREADY


class QueryNotFound(HamqError):
    code = ResponseCode.QUERY_NOT_FOUND


class InSyncReplicasNotEnough(HamqError):
    code = ResponseCode.IN_SYNC_REPLICAS_NOT_ENOUGH
    retriable = True


class BadFrame(HamqError):
    """The peer broke the framing rules; the connection is closed after this."""

    code = ResponseCode.BAD_FRAME


class NotLeader(HamqError):
    """DLedger: this member is not the group's leader; the route will name the new one."""

    code = ResponseCode.NOT_LEADER
    retriable = True
    refresh_route = True


class InvalidArgument(HamqError):
    code = ResponseCode.INVALID_ARGUMENT


class DiskFull(HamqError):
    code = ResponseCode.DISK_FULL
    retriable = True  # another broker group of the topic may still have room


class CrcMismatch(HamqError):
    code = ResponseCode.CRC_MISMATCH


class QueueNotExist(HamqError):
    code = ResponseCode.QUEUE_NOT_EXIST
    refresh_route = True


class BrokerNotFound(HamqError):
    code = ResponseCode.BROKER_NOT_FOUND
    retriable = True
    refresh_route = True


class QueueOffsetMismatch(HamqError):
    """A conditional send (``expected_queue_offset``) found the queue's next offset
    elsewhere: nothing was stored. ``end_offset`` is the queue's next offset when the
    broker looked (-1 if the answer did not say). Never retried: the caller decides."""

    code = ResponseCode.QUEUE_OFFSET_MISMATCH

    def __init__(self, message: str = "", end_offset: int = -1) -> None:
        super().__init__(message)
        self.end_offset = end_offset


class TransactionRolledBack(HamqError):
    """END_TRANSACTION COMMIT of a half message already rolled back (by a ROLLBACK, or by
    the broker's check-back giving up): its messages were never stored."""

    code = ResponseCode.TRANSACTION_ROLLED_BACK


class TransactionCommitted(HamqError):
    """END_TRANSACTION ROLLBACK of a half message already committed: its messages are
    stored and visible."""

    code = ResponseCode.TRANSACTION_COMMITTED


class ConnectionLost(HamqError):
    """Client side: the connection closed or could not be opened."""

    retriable = True
    refresh_route = True


class RequestTimeout(HamqError):
    """Client side: no response within the request's timeout."""

    retriable = True


class ConsumerCancelled(HamqError):
    """Client side: a consumer created with ``cancel_on_ha_failover`` saw the master of a
    broker group serving its topics change (RabbitMQ's ``x-cancel-on-ha-failover``
    notice); it consumes again once subscribed again. ``broker_name`` names the group."""

    def __init__(self, message: str = "", broker_name: str = "") -> None:
        super().__init__(message)
        self.broker_name = broker_name


class ConfigError(HamqError):
    """A configuration that cannot work: an unknown key, a wrong type, a number out of
    range, a value not among the allowed ones, or a combination that contradicts itself.
    The one class for every configuration, the Raft core's included; the message is one
    line naming the key, the value and what is allowed (``hamq.config_check``)."""

    code = ResponseCode.INVALID_ARGUMENT


class ControllerRefused(HamqError):
    """The controller refused a request (RocketMQ's CONTROLLER_* codes): nothing changed.
    ``code`` says which refusal; the subclasses are the ones a caller acts on."""

    code = ResponseCode.CONTROLLER_INVALID_REQUEST


class ControllerFenced(ControllerRefused):
    """An alter carried a stale master epoch or SyncStateSet epoch: the sender is no
    longer master in the controller's view, or lost a race; it must re-read its role."""

    code = ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH
    refresh_route = True


class ControllerNotLeader(ControllerRefused):
    """This controller peer is not the Raft leader (or lost leadership before the request
    was applied); the response's ``leader_addr`` names the leader when it is known."""

    code = ResponseCode.CONTROLLER_NOT_LEADER
    retriable = True


_CONTROLLER_CODES: dict[int, type[HamqError]] = {
    code: ControllerRefused for code in ResponseCode if code.name.startswith("CONTROLLER_")
}
_CONTROLLER_CODES[ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH] = ControllerFenced
_CONTROLLER_CODES[ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH] = ControllerFenced
_CONTROLLER_CODES[ResponseCode.CONTROLLER_NOT_LEADER] = ControllerNotLeader

_BY_CODE: dict[int, type[HamqError]] = _CONTROLLER_CODES | {
    cls.code: cls
    for cls in (
        BrokerSystemError,
        SystemBusy,
        RequestCodeNotSupported,
        MessageIllegal,
        ServiceNotAvailable,
        NoPermission,
        TopicNotExist,
        TopicExistAlready,
        QueryNotFound,
        InSyncReplicasNotEnough,
        BadFrame,
        InvalidArgument,
        NotLeader,
        DiskFull,
        CrcMismatch,
        QueueNotExist,
        BrokerNotFound,
        QueueOffsetMismatch,
        TransactionRolledBack,
        TransactionCommitted,
    )
}
