"""The chunk service holds an archive only while a transfer needs it, and serves exactly the bytes it hashed."""

from __future__ import annotations

import os

from edgesdk.fleet.protocol import ArchiveInfo, Topics
from edgesdk.ota_server.devices.chunks import ChunkDistributor, ResendLog


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


def test_the_resend_log_keeps_the_newest_pairs_and_indices_only():
    """A device asking once a second for an hour must not grow the server's memory (issue 60)."""
    chunks, _, _, _ = _service()
    chunks.repeat_s = 0.0
    chunks.resent = ResendLog(max_keys=3, max_indices=4)
    chunks.open("r1-w0", "m", "1.0.0")
    for _ in range(10):
        chunks.serve("cam1", "r1-w0", [0, 1, 2])
    assert chunks.resent[("cam1", "r1-w0")] == [2, 0, 1, 2]
    for device in ("cam2", "cam3", "cam4"):
        chunks.serve(device, "r1-w0", [1])
    assert list(chunks.resent) == [("cam2", "r1-w0"), ("cam3", "r1-w0"), ("cam4", "r1-w0")]


def test_a_refused_request_for_a_transfer_not_open_is_only_counted():
    """The device chooses the id: a refusal for one that is not open leaves no log line and nothing remembered."""
    chunks, loads, _, _ = _service()
    chunks.authorize = lambda device, transfer: False
    chunks.open("r1-w0", "m", "1.0.0")
    for i in range(100):
        chunks.refuse("stranger", f"r1-w{i + 1}")
    assert chunks.refused == 100 and chunks._refusals_logged == set()
    assert chunks.serve("stranger", "r1-w0", [0]) and chunks.refused == 101
    assert chunks._refusals_logged == {"r1-w0"} and loads == [("m", "1.0.0")] and chunks.loads == 1
