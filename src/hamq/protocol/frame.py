"""Frame codec: ``u32 frame length | u32 header length | msgpack header | body``.

Sans-IO (h11 style): ``FrameDecoder.feed(bytes)`` returns the complete frames it now holds
and raises ``BadFrame`` when the peer broke the rules; ``encode_frame`` returns the pieces
to write. The header is a msgpack array ``[code, opaque, flags, ext, remark]`` — an array
rather than a map because it is packed and unpacked for every request.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from hamq.errors import BadFrame, InvalidArgument
from hamq.protocol.codes import Flag
from hamq.protocol.limits import INT64_MAX, MAX_FRAME_BYTES, MAX_HEADER_BYTES, MAX_NAME_LENGTH
from hamq.protocol.message import validate_name

_PREFIX = struct.Struct(">II")
PREFIX_BYTES = _PREFIX.size
_packb = msgpack.Packer(use_bin_type=True).pack
Piece = bytes | memoryview  # a buffer handed to writelines as it is, never copied
# The read buffer grows with what actually arrives, never with what a frame declares (a
# peer declaring 16 MiB and sending one byte must not cost 16 MiB): reads are offered at
# least _MIN_READ_BYTES, doubling while reads fill what they are offered (a busy pipelined
# connection reads up to _MAX_READ_BYTES at once); an unfinished frame may at most double
# the buffer per step. A buffer grown past the shrink size is dropped once it is empty.
_MIN_READ_BYTES = 16 * 1024
_MAX_READ_BYTES = 1024 * 1024
_SHRINK_ABOVE_BYTES = 8 * 1024 * 1024  # a full pull response (4 MiB) keeps its buffer


class Frame:
    """One request or response. ``ext`` holds the request's named fields."""

    __slots__ = ("body", "code", "ext", "flags", "opaque", "remark")

    def __init__(
        self,
        code: int,
        opaque: int,
        flags: int = 0,
        ext: dict[str, Any] | None = None,
        remark: str = "",
        body: bytes = b"",
    ) -> None:
        self.code = code
        self.opaque = opaque
        self.flags = flags
        self.ext = ext if ext is not None else {}
        self.remark = remark
        self.body = body

    @property
    def is_oneway(self) -> bool:
        return bool(self.flags & Flag.ONEWAY)

    def __repr__(self) -> str:
        return (
            f"Frame(code={self.code}, opaque={self.opaque}, flags={self.flags}, "
            f"ext={self.ext!r}, remark={self.remark!r}, body={len(self.body)} bytes)"
        )


def encode_frame(
    code: int,
    opaque: int,
    flags: int = 0,
    ext: dict[str, Any] | None = None,
    remark: str = "",
    body: Piece | list[Piece] = b"",
) -> list[Piece]:
    """Pieces for ``transport.writelines``; the body is never copied. It may itself be a
    list of pieces (one large piece shared by several frames is then written by reference)."""
    header = _packb([code, opaque, flags, ext or None, remark or None])
    pieces = body if isinstance(body, list) else [body] if body else []
    total = 4 + len(header) + sum(map(len, pieces))
    if total > MAX_FRAME_BYTES:
        raise BadFrame(f"frame of {total} bytes exceeds the limit of {MAX_FRAME_BYTES}")
    return [_PREFIX.pack(total, len(header)) + header, *pieces]


def encode_frame_bytes(*args: Any, **kwargs: Any) -> bytes:
    return b"".join(encode_frame(*args, **kwargs))


class FrameDecoder:
    """Accumulates bytes and yields complete frames.

    Two ways in: ``feed(bytes)``, or — to save a copy per read — ``get_buffer()`` for the
    socket to read into followed by ``buffer_updated(n)`` (asyncio's BufferedProtocol).
    After ``BadFrame`` the stream is unusable (framing is lost); the caller answers if it
    can and closes the connection.
    """

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray(_MIN_READ_BYTES)
        self._start = 0  # first unparsed byte
        self._end = 0  # end of received bytes
        self._read_bytes = _MIN_READ_BYTES  # free space offered to the next read
        self._max_frame_bytes = max_frame_bytes
        self.last_opaque: int | None = None  # of the last frame whose header was readable

    @property
    def pending_bytes(self) -> int:
        """Bytes of a frame received only in part."""
        return self._end - self._start

    def feed(self, data: bytes) -> list[Frame]:
        frames: list[Frame] = []
        view = memoryview(data)
        while view:
            target = self.get_buffer(len(view))
            n = min(len(target), len(view))
            target[:n] = view[:n]
            view = view[n:]
            frames += self.buffer_updated(n)
        return frames

    def get_buffer(self, size_hint: int = -1) -> memoryview:
        """Free space at the end of the buffer: what the last reads suggest, and for a frame
        received in part at most as much again as has arrived of it (``size_hint`` is the
        event loop's default read size, not a need, so it is ignored)."""
        want = self._read_bytes
        pending = self._end - self._start
        if pending >= PREFIX_BYTES:
            total = _PREFIX.unpack_from(self._buf, self._start)[0]
            if total <= self._max_frame_bytes:
                want = max(want, min(4 + total - pending, pending))
        if len(self._buf) - self._end < want:
            if len(self._buf) - pending >= want:
                # Room enough once the unparsed tail moves to the front: a same-length
                # slice assignment, which never resizes (the loop may hold an old view).
                self._buf[:pending] = self._buf[self._start : self._end]
            else:  # a bigger buffer; allocating (and zeroing) it is the rare case
                fresh = bytearray(pending + want)
                fresh[:pending] = self._buf[self._start : self._end]
                self._buf = fresh
            self._start, self._end = 0, pending
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> list[Frame]:
        self._end += nbytes
        if self._end == len(self._buf) and self._read_bytes < _MAX_READ_BYTES:
            self._read_bytes *= 2  # the read filled all it was offered: more is waiting
        frames, pos = self._parse(self._buf, self._start, self._end)
        if pos == self._end:
            self._start = self._end = 0
            if len(self._buf) > _SHRINK_ABOVE_BYTES:  # one huge frame must not pin memory
                self._buf = bytearray(_MIN_READ_BYTES)
                self._read_bytes = _MIN_READ_BYTES
        else:
            self._start = pos
        return frames

    def _parse(self, buf: bytearray, pos: int, end: int) -> tuple[list[Frame], int]:
        frames: list[Frame] = []
        unpack_prefix = _PREFIX.unpack_from
        view = memoryview(buf)
        try:
            while end - pos >= PREFIX_BYTES:
                total, header_len = unpack_prefix(buf, pos)
                if total > self._max_frame_bytes:
                    raise BadFrame(
                        f"frame declares {total} bytes, more than the limit of "
                        f"{self._max_frame_bytes}"
                    )
                if header_len > MAX_HEADER_BYTES or header_len + 4 > total or header_len == 0:
                    raise BadFrame(
                        f"frame declares a header of {header_len} bytes in a frame of {total} bytes"
                    )
                frame_end = pos + 4 + total
                if frame_end > end:
                    break
                body_start = pos + PREFIX_BYTES + header_len
                frame = _decode_header(
                    view[pos + PREFIX_BYTES : body_start], bytes(view[body_start:frame_end])
                )
                self.last_opaque = frame.opaque
                frames.append(frame)
                pos = frame_end
        finally:
            view.release()
        return frames, pos


def _decode_header(raw: bytes | memoryview, body: bytes) -> Frame:
    try:
        fields = msgpack.unpackb(raw, raw=False, use_list=True, strict_map_key=False)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types
        raise BadFrame(f"frame header is not valid msgpack: {exc}") from None
    if not isinstance(fields, list) or len(fields) != 5:
        raise BadFrame("frame header must be [code, opaque, flags, ext, remark]")
    code, opaque, flags, ext, remark = fields
    if not (isinstance(code, int) and isinstance(opaque, int) and isinstance(flags, int)):
        raise BadFrame("frame header code, opaque and flags must be integers")
    if ext is not None and not isinstance(ext, dict):
        raise BadFrame("frame header ext must be a map")
    if remark is not None and not isinstance(remark, str):
        raise BadFrame("frame header remark must be a string")
    return Frame(code, opaque, flags, ext if ext is not None else {}, remark or "", body)


def pack_body(obj: Any) -> bytes:
    """Structured request/response bodies (route tables, topic configs) are msgpack."""
    return _packb(obj)


def unpack_body(body: bytes) -> Any:
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False) if body else None
    except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types
        raise InvalidArgument(f"request body is not valid msgpack: {exc}") from None


def optional(
    ext: dict[str, Any], name: str, default: int, low: int = 0, high: int = INT64_MAX
) -> int:
    """An optional integer request field, checked: a wrong type or a value out of range is
    an ``InvalidArgument`` naming the field, never a server-side crash."""
    value = ext.get(name)
    return default if value is None else check_int(name, value, low, high)


def require_int(ext: dict[str, Any], name: str, low: int = 0, high: int = INT64_MAX) -> int:
    """A required integer request field in ``low..high``."""
    if name not in ext:
        raise InvalidArgument(f"request field {name!r} missing")
    return check_int(name, ext[name], low, high)


def check_int(name: str, value: Any, low: int = 0, high: int = INT64_MAX) -> int:
    """``value`` (of the request field ``name``) is an integer in ``low..high``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"request field {name!r} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise InvalidArgument(f"request field {name!r} must be in {low}..{high}, got {value}")
    return value


def require(ext: dict[str, Any], name: str, kind: type = str) -> Any:
    """A named request field, checked; a clear error names what is missing."""
    value = ext.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise InvalidArgument(f"request field {name!r} missing or not {kind.__name__}")
    return value


def require_name(ext: dict[str, Any], name: str, max_length: int = MAX_NAME_LENGTH) -> str:
    """A group, broker or cluster name field: a safe name (see ``validate_name``)."""
    return validate_name(ext.get(name), f"request field {name!r}", max_length)
