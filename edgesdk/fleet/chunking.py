"""Content-defined chunking: cut an archive where its content says, so equal bytes give equal chunks.

A fixed-size split moves every later chunk boundary when a byte is inserted, so a new
model version that shares 95% of its bytes with the old one would still share almost no
chunks. Here a boundary falls where a rolling hash of the last 32 bytes has its top bits
zero (a gear hash, as in FastCDC), so boundaries move with the content and re-align a few
kilobytes after any change. As in FastCDC, a stricter mask before the average size and a
looser one after it keep chunk sizes close to the average; ``min_size`` and ``max_size``
bound them.

The hash is computed with numpy over whole blocks (five shifted adds per block, no Python
loop per byte); only the cut decisions loop, once per chunk.

``boundaries`` are offsets where a cut is forced (the start and end of each file in a tar
archive), so a file that changed does not drag its neighbour's bytes into new chunks.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterable

import numpy as np

__all__ = ["MIN_CHUNK", "AVG_CHUNK", "MAX_CHUNK", "cut_points", "tar_boundaries"]

MIN_CHUNK = 16 * 1024
AVG_CHUNK = 64 * 1024
MAX_CHUNK = 256 * 1024
_WINDOW = 32  # bytes the rolling hash looks back over
_BLOCK = 8 * 1024 * 1024  # bytes hashed per numpy pass (bounds the memory of a 2 GiB archive)


def _gear() -> np.ndarray:
    """256 pseudo-random 32-bit values, derived from SHA-256 so they never change between releases."""
    digest = b"".join(hashlib.sha256(b"edgesdk-gear-%d" % i).digest()[:4] for i in range(256))
    return np.frombuffer(digest, dtype="<u4").astype(np.uint32)


_GEAR = _gear()


def _masks(avg_size: int) -> tuple[np.uint32, np.uint32]:
    """Masks over the hash's top bits: one bit stricter than the average before it, one looser after."""
    bits = max(1, int(avg_size).bit_length() - 1)
    strict = ((1 << min(bits + 1, 32)) - 1) << (32 - min(bits + 1, 32))
    loose = ((1 << max(bits - 1, 1)) - 1) << (32 - max(bits - 1, 1))
    return np.uint32(strict), np.uint32(loose)


def _candidates(view: memoryview, start: int, end: int, masks: tuple[np.uint32, np.uint32]) -> tuple[np.ndarray, ...]:
    """Offsets p in (start, end] where the hash of the bytes before p passes each mask (ascending arrays)."""
    strict_hits, loose_hits = [], []
    for block_start in range(start, end, _BLOCK):
        block_end = min(block_start + _BLOCK, end)
        lead = min(_WINDOW - 1, block_start - start)  # the window reaches back into the previous block
        data = np.frombuffer(view[block_start - lead:block_end], dtype=np.uint8)
        gear = _GEAR[data]
        h = gear  # h[i] = sum over k < 32 of gear[i - k] << k (mod 2**32), built by doubling the window
        span = 1
        while span < _WINDOW:
            doubled = h.copy()
            doubled[span:] += h[:-span] << np.uint32(span)
            h, span = doubled, span * 2
        h = h[lead:]
        offsets = np.arange(block_start + 1, block_end + 1, dtype=np.int64)  # a cut after byte i is at i + 1
        strict_hits.append(offsets[(h & masks[0]) == 0])
        loose_hits.append(offsets[(h & masks[1]) == 0])
    empty = np.zeros(0, dtype=np.int64)
    return (np.concatenate(strict_hits) if strict_hits else empty, np.concatenate(loose_hits) if loose_hits else empty)


def _cut_segment(view: memoryview, start: int, end: int, min_size: int, avg_size: int, max_size: int) -> list[int]:
    strict, loose = _candidates(view, start, end, _masks(avg_size))
    cuts, position = [], start
    while end - position > min_size:
        low, middle, high = position + min_size, position + avg_size, min(position + max_size, end)
        cut = high
        i = int(np.searchsorted(strict, low, side="left"))
        if i < len(strict) and strict[i] < min(middle, high):
            cut = int(strict[i])
        else:
            j = int(np.searchsorted(loose, min(middle, high), side="left"))
            if j < len(loose) and loose[j] < high:
                cut = int(loose[j])
        cuts.append(cut)
        position = cut
    if position < end:
        cuts.append(end)
    return cuts


def cut_points(data: bytes | memoryview, *, min_size: int = MIN_CHUNK, avg_size: int = AVG_CHUNK,
               max_size: int = MAX_CHUNK, boundaries: Iterable[int] = ()) -> list[int]:
    """End offsets of the content-defined chunks of ``data``, ascending; the last is ``len(data)``.

    Every chunk is at most ``max_size`` bytes and, except where a segment ends (the end of the
    data or a forced boundary), at least ``min_size``. ``boundaries`` are forced cut offsets.
    """
    if not 0 < min_size <= avg_size <= max_size:
        raise ValueError(f"chunk sizes min {min_size}, avg {avg_size}, max {max_size} must satisfy 0 < min <= avg <= max")
    view = memoryview(data).cast("B")
    size = len(view)
    edges = sorted({0, size, *(b for b in boundaries if 0 < b < size)})
    cuts: list[int] = []
    for start, end in zip(edges, edges[1:]):
        cuts.extend(_cut_segment(view, start, end, min_size, avg_size, max_size))
    return cuts


def tar_boundaries(data: bytes) -> list[int]:
    """The start and end offsets of each member's data in an uncompressed tar (none if ``data`` is no tar)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            return [edge for member in tar.getmembers() if member.isfile()
                    for edge in (member.offset_data, member.offset_data + member.size)]
    except tarfile.TarError:
        return []
