"""Content-defined chunks, the archive table in a signed manifest, and per-chunk zstd."""

from __future__ import annotations

import hashlib
import io
import tarfile

import numpy as np
import pytest
import zstandard

from edgesdk.errors import TransferError
from edgesdk.fleet.chunk_codec import compress_chunks, decode_chunk
from edgesdk.fleet.chunking import MAX_CHUNK, MIN_CHUNK, cut_points, tar_boundaries
from edgesdk.fleet.protocol import MAX_CHUNK_BYTES, ArchiveInfo, archive_info

DATA = np.random.default_rng(0).integers(0, 256, 3_000_000, dtype=np.uint8).tobytes()


def _chunks(data: bytes) -> list[bytes]:
    info = ArchiveInfo.of(data)
    return [data[slice(*info.chunk_range(i))] for i in range(len(info.chunks))]


def test_cuts_cover_the_data_within_the_size_bounds():
    cuts = cut_points(DATA)
    sizes = np.diff([0, *cuts])
    assert cuts[-1] == len(DATA) and all(sizes > 0)
    assert sizes[:-1].min() >= MIN_CHUNK and sizes.max() <= MAX_CHUNK
    assert 30 <= len(cuts) <= 90  # about 3 MB / 64 KiB on average


def test_cuts_follow_the_content_so_an_insertion_changes_only_the_chunks_around_it():
    for where in (17, 1_000_000, 2_500_000):
        edited = DATA[:where] + b"a few inserted bytes" + DATA[where:]
        new = [c for c in _chunks(edited) if c not in set(_chunks(DATA))]
        assert 1 <= len(new) <= 2, where
        assert sum(map(len, new)) <= 2 * MAX_CHUNK


def test_fixed_chunks_would_lose_everything_after_an_insertion():
    """The reason for content-defined cuts: with fixed ones, every chunk after the edit is new."""
    edited = DATA[:1000] + b"x" + DATA[1000:]
    fixed_old = {hashlib.sha256(c).digest() for c in (DATA[i:i + 65536] for i in range(0, len(DATA), 65536))}
    fixed_new = [hashlib.sha256(edited[i:i + 65536]).digest() for i in range(0, len(edited), 65536)]
    assert sum(h not in fixed_old for h in fixed_new) == len(fixed_new)


def test_forced_boundaries_are_cut_and_the_chunking_is_deterministic():
    cuts = cut_points(DATA, boundaries=[12_345, 2_000_001])
    assert 12_345 in cuts and 2_000_001 in cuts
    assert cut_points(DATA) == cut_points(bytes(DATA))


def test_tar_boundaries_are_each_member_data_start_and_end():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, body in (("a.bin", DATA[:100_000]), ("b.bin", DATA[100_000:150_000])):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    data = buffer.getvalue()
    edges = tar_boundaries(data)
    assert len(edges) == 4 and data[edges[0]:edges[1]] == DATA[:100_000] and data[edges[2]:edges[3]] == DATA[100_000:150_000]
    assert set(edges) <= set(cut_points(data, boundaries=edges)) | {0}
    assert tar_boundaries(b"not a tar archive" * 100) == []
    assert archive_info(data).size == len(data)


def test_the_manifest_table_round_trips_and_old_fixed_size_manifests_still_parse():
    info = ArchiveInfo.of(DATA)
    assert ArchiveInfo.from_json(info.to_json()) == info
    legacy = {"sha256": info.sha256, "size": 1000, "chunk_size": 300, "chunks": ["0" * 64] * 4}
    parsed = ArchiveInfo.from_json(legacy)
    assert parsed.sizes == (300, 300, 300, 100) and parsed.chunk_range(3) == (900, 1000)


@pytest.mark.parametrize("change", [
    {"sizes": [1, 2]},                                   # sizes do not add up to the size
    {"chunks": ["not hex"]},                             # a hash that is not 64 hex digits
    {"sizes": [MAX_CHUNK_BYTES + 1], "size": MAX_CHUNK_BYTES + 1, "chunks": ["0" * 64]},  # a chunk over the cap
    {"zstd": [99]},                                      # a compressed chunk the archive does not have
    {"size": 0, "sizes": [], "chunks": []},              # an empty archive
    {"sizes": "abc"},                                    # not numbers
])
def test_an_inconsistent_table_is_refused(change):
    table = {**ArchiveInfo.of(DATA[:1000]).to_json(), **change}
    with pytest.raises(TransferError, match="archive"):
        ArchiveInfo.from_json(table)


def test_chunks_that_shrink_go_compressed_and_decode_to_the_signed_bytes():
    data = bytes(200_000) + DATA[:300_000]  # zeros compress, random bytes do not
    info, payloads = compress_chunks(data, ArchiveInfo.of(data))
    assert info.zstd and len(info.zstd) < len(info.chunks)
    for index, payload in enumerate(payloads):
        raw = decode_chunk(info, index, payload)
        assert hashlib.sha256(raw).hexdigest() == info.chunks[index]
        assert (len(payload) < len(raw)) == (index in info.zstd)
    plain, payloads = compress_chunks(data, ArchiveInfo.of(data), min_saving=None)
    assert not plain.zstd and b"".join(payloads) == data


def test_a_hostile_compressed_chunk_is_refused_before_it_is_inflated():
    data = bytes(100_000)
    info, _ = compress_chunks(data, ArchiveInfo.of(data))
    index = min(info.zstd)
    bomb = zstandard.ZstdCompressor().compress(bytes(50_000_000))  # says it holds 50 MB
    with pytest.raises(TransferError, match="50000000 bytes, the manifest says"):
        decode_chunk(info, index, bomb)
    with pytest.raises(TransferError, match="not valid zstd"):
        decode_chunk(info, index, b"garbage")
