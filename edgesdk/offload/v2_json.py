"""The JSON part of a KServe V2 body with its numeric ``data`` lists parsed straight into arrays.

A 1x3x224x224 FP32 tensor sent as JSON is a list of 150,528 numbers. Parsed by orjson it becomes
as many Python floats, which NumPy then walks again; here pysimdjson (the [server] extra) parses
the body once and copies each tensor's numbers into a typed buffer in C, so no Python number is
made. Everything else in the header (names, shapes, parameters) becomes plain Python as usual.

The fast path only ever answers when it would give exactly what the standard path
(:func:`json.loads` / orjson, then ``np.asarray(data, dtype)``) gives; whenever it cannot be sure
it says so and the caller decodes the standard way, which also words every error. It steps aside
when pysimdjson is not installed, for JSON it refuses (``NaN``/``Infinity`` tokens, bad UTF-8),
duplicate keys, any backslash escape (``\\u005b`` is a ``[``, which would spoil the count of lists),
a ``data`` list whose nesting is not regular (``[[1, 2], [3]]``, ``[1, [2]]``), values that are
not all numbers of the tensor's kind (booleans, strings, a float in an INT64 tensor), integers
outside the datatype's range, a float that overflows FP32 or FP16, and BOOL tensors.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

__all__ = ["Numbers", "NotExact", "fast_header"]

_simdjson: Any
try:  # the [server] extra installs pysimdjson; a device decodes the standard way
    import simdjson as _simdjson
except ImportError:
    _simdjson = None

_local = threading.local()
#: Bodies up to this size are parsed by a parser kept per thread (a 1x3x224x224 FP32 page as JSON is 2.9 MB).
KEEP_PARSER_BYTES = 8 * 1024 * 1024
#: ``dtype.kind`` -> pysimdjson buffer type and the NumPy dtype of that buffer.
_BUFFERS = {"f": ("d", np.dtype(np.float64)), "i": ("i", np.dtype(np.int64)), "u": ("u", np.dtype(np.uint64))}


class NotExact(Exception):
    """The fast path cannot give exactly the standard decode's answer for this body: decode it the standard way."""


class Numbers:
    """A tensor's ``data`` list, still in the parsed document (a regular nest of ``arrays`` lists):
    :meth:`values` copies it into an array."""

    def __init__(self, array: Any, arrays: int) -> None:
        self.array, self.arrays = array, arrays

    def values(self, dtype: np.dtype[Any]) -> np.ndarray:
        """The numbers as a flat array of ``dtype``; NotExact when the standard path might answer otherwise."""
        kind = _BUFFERS.get(dtype.kind)
        if kind is None:
            raise NotExact(f"{dtype} data is decoded the standard way")
        try:
            raw = np.frombuffer(self.array.as_buffer(of_type=kind[0]), dtype=kind[1])
        except (TypeError, ValueError) as exc:  # not all numbers of this kind, or out of the buffer type's range
            raise NotExact(str(exc)) from None
        if dtype.kind in "iu" and raw.size and dtype.itemsize < 8:
            info = np.iinfo(dtype)
            if raw.min() < info.min or raw.max() > info.max:
                raise NotExact(f"a value is outside {dtype}'s range")
        try:
            with np.errstate(over="raise"):
                return raw.astype(dtype)
        except FloatingPointError as exc:
            raise NotExact(str(exc)) from None


def _nest(array: Any) -> int | None:
    """How many lists a regular nest of lists holds (a flat list: 1); None when the nest is not regular.

    Only the lists above the innermost level are walked: the innermost lists' values stay in C. A list
    hidden among those values (``[1, [2]]``) is found by :func:`fast_header`'s count of ``[``.
    """
    level, arrays = [array], 0
    while True:
        arrays += len(level)
        length = len(level[0])
        if any(len(node) != length for node in level):
            return None
        if length == 0 or not isinstance(level[0][0], _simdjson.Array):
            return arrays
        level = [child for node in level for child in node]
        if not all(isinstance(child, _simdjson.Array) for child in level):
            return None


def _python(value: Any) -> Any:
    if isinstance(value, _simdjson.Object):
        return value.as_dict()
    if isinstance(value, _simdjson.Array):
        return value.as_list()
    return value


def _keys(obj: Any) -> list[str] | None:
    keys = list(obj.keys())
    return keys if len(set(keys)) == len(keys) else None  # duplicates: orjson keeps the last, simdjson the first


def _brackets(value: Any) -> int:
    """How many ``[`` the JSON text of a plain Python value holds (its lists and the brackets in its strings)."""
    if isinstance(value, str):
        return value.count("[")
    if isinstance(value, list):
        return 1 + sum(_brackets(v) for v in value)
    if isinstance(value, dict):
        return sum(k.count("[") + _brackets(v) for k, v in value.items())
    if isinstance(value, Numbers):
        return value.arrays
    return 0


def _parse(text: bytes) -> Any:
    """The parsed document; a thread reuses its parser, except for a body over :data:`KEEP_PARSER_BYTES`, whose
    buffers (several times its size) then go with its document instead of staying with the thread."""
    if len(text) > KEEP_PARSER_BYTES:
        return _simdjson.Parser().parse(text)
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = _simdjson.Parser()
    try:
        return parser.parse(text)
    except RuntimeError:  # a document of this thread's last body is still referenced (a traceback): a new parser
        _local.parser = _simdjson.Parser()
        return _local.parser.parse(text)


def fast_header(text: bytes) -> dict[str, Any] | None:
    """The JSON object ``text`` with each tensor's ``data`` list as :class:`Numbers`; None: decode it the standard way.

    Tensors are the entries of the top-level ``inputs`` and ``outputs`` lists.
    """
    if _simdjson is None or b"\\" in text:  # an escape might hide a '[' from the count below
        return None
    try:
        doc = _parse(text)
    except (ValueError, RuntimeError):  # not JSON simdjson takes (NaN tokens, bad UTF-8): the standard path words it
        return None
    keys = _keys(doc) if isinstance(doc, _simdjson.Object) else None
    if keys is None:
        return None
    header: dict[str, Any] = {}
    for key in keys:
        value = doc[key]
        if key in ("inputs", "outputs") and isinstance(value, _simdjson.Array):
            header[key] = entries = []
            for entry in value:
                if not isinstance(entry, _simdjson.Object):
                    entries.append(_python(entry))
                    continue
                fields = _keys(entry)
                if fields is None:
                    return None
                tensor = {}
                for name in fields:
                    item = entry[name]
                    if name == "data" and isinstance(item, _simdjson.Array):
                        nest = _nest(item)
                        if nest is None:
                            return None
                        tensor[name] = Numbers(item, nest)
                    else:
                        tensor[name] = _python(item)
                entries.append(tensor)
        else:
            header[key] = _python(value)
    # Every '[' of the text is a list of the header or of a regular nest, unless a list hides among the numbers.
    if text.count(b"[") != _brackets(header):
        return None
    return header
