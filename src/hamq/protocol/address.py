"""The ``HOST:PORT`` check for addresses a peer hands us in a request field.

Both the name server (broker and HA addresses in a registration) and the controller wire
codec (member and master addresses) trust these strings enough to connect to them, so
they share one check at the protocol layer.
"""

from __future__ import annotations

from hamq.errors import InvalidArgument
from hamq.protocol.limits import MAX_ADDRESS_LENGTH


def address(value: object, field: str) -> str:
    """``HOST:PORT`` with a printable host and a port in 1..65535."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ADDRESS_LENGTH:
        raise InvalidArgument(f"request field {field!r} must be HOST:PORT, got {value!r:.80}")
    host, _, port = value.rpartition(":")
    if (
        not host
        or not host.isprintable()
        or " " in host
        or not port.isascii()
        or not port.isdigit()
        or not 0 < int(port) < 65536
    ):
        raise InvalidArgument(
            f"request field {field!r} must be HOST:PORT with a port in 1..65535, got {value!r}"
        )
    return value
