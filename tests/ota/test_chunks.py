"""The chunk service holds an archive only while a transfer needs it, and serves exactly the bytes it hashed."""

from __future__ import annotations

import os

from edgesdk.fleet.protocol import ArchiveInfo, Topics
from edgesdk.ota_server.devices.chunks import ChunkDistributor


def _service():
    loads: list[tuple[str, str]] = []
    sent: list[tuple[str, bytes]] = []
    archives = {("m", "1.0.0"): os.urandom(10_000), ("m", "2.0.0"): os.urandom(7_000)}

    def load(name: str, version: str) -> tuple[bytes, ArchiveInfo]:
        loads.append((name, version))
        data = archives[(name, version)]
        return data, ArchiveInfo.of(data, 4096)

    return ChunkDistributor(load, lambda topic, payload: sent.append((topic, payload))), loads, sent, archives


def test_an_archive_is_loaded_once_shared_and_evicted_with_its_last_transfer():
    chunks, loads, _, archives = _service()
    info = chunks.open("r1-w0", "m", "1.0.0")
    assert chunks.open("r1-w1", "m", "1.0.0") == info and chunks.open("r1-w0", "m", "1.0.0") == info
    assert loads == [("m", "1.0.0")] and chunks.held_bytes == len(archives[("m", "1.0.0")])
    chunks.open("r2-w0", "m", "2.0.0")
    chunks.close("r1-w0")
    assert chunks.held_bytes == len(archives[("m", "1.0.0")]) + len(archives[("m", "2.0.0")])
    chunks.close_all("r1-")
    assert chunks.held_bytes == len(archives[("m", "2.0.0")]) and not chunks.is_open("r1-w1")
    chunks.close("r2-w0")
    chunks.close("r2-w0")  # closing twice is harmless
    assert chunks.held_bytes == 0
    chunks.open("r3-w0", "m", "1.0.0")
    assert loads == [("m", "1.0.0"), ("m", "2.0.0"), ("m", "1.0.0")], "an evicted archive is loaded again"


def test_broadcast_and_resend_publish_the_hashed_bytes_on_the_right_topics():
    chunks, _, sent, archives = _service()
    chunks.repeat_s = 0.0  # answer a request right after the broadcast (tests/unit/test_chunk_service.py: the wait)
    data = archives[("m", "1.0.0")]
    info = chunks.open("r1-w0", "m", "1.0.0")
    chunks.broadcast("cams", "r1-w0")
    assert [t for t, _ in sent] == [f"{Topics.group_chunks('cams', 'r1-w0')}/{i}" for i in range(len(info.chunks))]
    assert b"".join(p for _, p in sent) == data
    sent.clear()
    assert chunks.serve("cam1", "r1-w0", [2, 0, 99, -1])
    assert sent == [(f"{Topics.device_chunks('cam1', 'r1-w0')}/2", data[8192:]),
                    (f"{Topics.device_chunks('cam1', 'r1-w0')}/0", data[:4096])]
    assert chunks.resent[("cam1", "r1-w0")] == [2, 0]
    chunks.close("r1-w0")
    sent.clear()
    assert not chunks.serve("cam1", "r1-w0", [0]) and sent == []
    chunks.broadcast("cams", "r1-w0")
    assert sent == []
