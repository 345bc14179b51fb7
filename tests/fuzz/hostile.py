"""Hypothesis strategies for hostile network input: values of every wrong type and range, valid messages
with fields replaced, removed or added, and valid bytes truncated, flipped or spliced.

Pure random bytes rarely get past a parser's first ``json.loads``; a valid message with one field
changed does, and reaches the code behind it. So every target draws from both.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

#: Values chosen to break parsers: 64-bit edges and beyond, non-finite floats, path and topic characters,
#: long and control-character strings.
EDGE_VALUES = [2**31, 2**63 - 1, 2**63, -2**63 - 1, 2**64, 2**70, -1, 0, 1e308, -0.0, "", "../x", "a/b", "+", "#",
               "x" * 5000, "\x00", "é" * 64, "1.0.0", "999999999999999999999.0", "1e9", "digits", "cams", True, False,
               None, [], {}]

scalars = st.one_of(
    st.sampled_from(EDGE_VALUES),
    st.none(), st.booleans(),
    st.integers(min_value=-2**72, max_value=2**72),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
)

#: Any JSON value, nested a few levels.
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)


def _slots(doc: Any, path: tuple = ()) -> list[tuple]:
    """Every (path to a container, key) in ``doc``: the places a mutation can act on."""
    out: list[tuple] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            out.append((path, key))
            out.extend(_slots(value, (*path, key)))
    elif isinstance(doc, list):
        for index, value in enumerate(doc[:8]):
            out.append((path, index))
            out.extend(_slots(value, (*path, index)))
    return out


def _container(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


@st.composite
def mutated(draw: Any, valid: dict[str, Any], max_changes: int = 3) -> dict[str, Any]:
    """``valid`` with 0 to ``max_changes`` fields set to hostile values, deleted, or added."""
    doc = copy.deepcopy(valid)
    for _ in range(draw(st.integers(0, max_changes))):
        slots = _slots(doc)
        if not slots:
            break
        path, key = draw(st.sampled_from(slots))
        try:
            container = _container(doc, path)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change replaced this part of the document
        action = draw(st.sampled_from(["set", "set", "delete", "add"]))
        if action == "delete" and isinstance(container, dict):
            container.pop(key, None)
        elif action == "add" and isinstance(container, dict):
            container[draw(st.text(max_size=12))] = draw(json_values)
        else:
            container[key] = draw(json_values)
    return doc


def encode(doc: Any) -> bytes:
    """``doc`` as JSON bytes (NaN and Infinity written as Python's json does, as a careless sender would)."""
    return json.dumps(doc).encode()


@st.composite
def damaged(draw: Any, valid: bytes) -> bytes:
    """``valid`` truncated, with bytes flipped, or with random bytes spliced in."""
    data = bytearray(valid)
    action = draw(st.sampled_from(["truncate", "flip", "splice"]))
    if action == "truncate":
        return bytes(data[:draw(st.integers(0, max(0, len(data) - 1)))])
    if action == "flip":
        for _ in range(draw(st.integers(1, 8))):
            if data:
                data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        return bytes(data)
    at = draw(st.integers(0, len(data)))
    return bytes(data[:at]) + draw(st.binary(max_size=64)) + bytes(data[at:])


def json_messages(valid: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """Payloads for a JSON message parser: ``valid`` mutated, its bytes damaged, or arbitrary bytes."""
    return st.one_of(mutated(valid).map(encode), mutated(valid).map(encode), damaged(encode(valid)),
                     st.binary(max_size=256), json_values.map(encode))
