# The part of msgpack's API that hamq uses, typed: msgpack ships no type information and no
# stubs package is maintained. Unpacking yields Any: callers check or declare what they expect.
from collections.abc import Callable
from typing import Any

from _typeshed import ReadableBuffer

class UnpackException(Exception): ...

class Packer:
    # No autoreset: with autoreset=False pack() returns None, which hamq never wants.
    def __init__(
        self,
        default: Callable[[Any], Any] | None = None,
        *,
        use_single_float: bool = False,
        use_bin_type: bool = True,
        strict_types: bool = False,
        datetime: bool = False,
        unicode_errors: str | None = None,
    ) -> None: ...
    def pack(self, obj: Any) -> bytes: ...

def packb(
    o: Any,
    *,
    default: Callable[[Any], Any] | None = None,
    use_single_float: bool = False,
    use_bin_type: bool = True,
    strict_types: bool = False,
    datetime: bool = False,
    unicode_errors: str | None = None,
) -> bytes: ...
def unpackb(
    packed: ReadableBuffer,
    *,
    raw: bool = False,
    use_list: bool = True,
    strict_map_key: bool = True,
    timestamp: int = 0,
    unicode_errors: str | None = None,
    object_hook: Callable[[dict[Any, Any]], Any] | None = None,
    list_hook: Callable[[list[Any]], Any] | None = None,
    ext_hook: Callable[[int, bytes], Any] = ...,
) -> Any: ...
