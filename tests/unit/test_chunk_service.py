"""The chunk service under a crowd: repeated requests are answered once, and many devices asking at once get
the archive broadcast again instead of one copy each."""

from __future__ import annotations

from edgesdk.fleet.protocol import ArchiveInfo
from edgesdk.ota_server.devices.chunks import MAX_OUTBOX, ChunkDistributor

DATA = bytes(range(256)) * 40  # 10,240 bytes: 3 chunks of 4,096


def _service(**options):
    sent: list[str] = []
    service = ChunkDistributor(lambda name, version: (DATA, ArchiveInfo.of(DATA, 4096)),
                               lambda topic, payload: sent.append(topic), **options)
    service.open("r1-w0", "digits", "2.0.0")
    return service, sent


def test_a_device_asking_again_at_once_is_answered_once():
    service, sent = _service(repeat_s=60.0)
    assert service.serve("cam0", "r1-w0", [0, 2]) and service.serve("cam0", "r1-w0", [0, 2])
    assert sent == ["edgesdk/devices/cam0/chunks/r1-w0/0", "edgesdk/devices/cam0/chunks/r1-w0/2"]
    assert service.serve("cam1", "r1-w0", [1]) and sent[-1] == "edgesdk/devices/cam1/chunks/r1-w0/1"


def test_a_crowd_that_missed_the_broadcast_gets_it_again_once():
    service, sent = _service(repeat_s=60.0, rebroadcast_after=3)
    service.broadcast("cams", "r1-w0")
    del sent[:]
    service._broadcasts["r1-w0"] = ("cams", 0.0)  # the first broadcast went out long ago
    for device in ("cam0", "cam1", "cam2", "cam3"):
        service.serve(device, "r1-w0", [0, 1, 2])
    per_device = [t for t in sent if "/devices/" in t]
    to_group = [t for t in sent if t.startswith("edgesdk/groups/cams/chunks/r1-w0/")]
    assert len(per_device) == 6, "the first two devices are answered one by one, the fourth not right after a broadcast"
    assert len(to_group) == 3 and service.rebroadcasts == 1, "the third asking device triggers one group broadcast"


def test_a_planned_transfer_gets_a_group_broadcast_for_a_crowd_before_any_broadcast_went_out():
    """A replica that took a rollout over never broadcast its stage: a crowd of requests must not cost one copy per
    device (at 10,000 devices that queued 65,535 messages)."""
    service, sent = _service(repeat_s=60.0, rebroadcast_after=3)
    service.plan("r1-w0", [0, 1, 2], "cams")
    for device in ("cam0", "cam1", "cam2", "cam3"):
        service.serve(device, "r1-w0", [0, 1, 2])
    assert [t for t in sent if t.startswith("edgesdk/groups/cams/chunks/r1-w0/")] == [
        f"edgesdk/groups/cams/chunks/r1-w0/{i}" for i in range(3)]
    assert len([t for t in sent if "/devices/" in t]) == 6 and service.rebroadcasts == 1


def test_requests_wait_unanswered_while_the_outbox_is_full():
    queued = [MAX_OUTBOX + 1]
    service, sent = _service(outbox=lambda: queued[0])
    assert service.serve("cam0", "r1-w0", [0, 1]) and sent == [] and service.deferred == 1
    queued[0] = 0
    assert service.serve("cam0", "r1-w0", [0, 1]) and len(sent) == 2, "asked again once the outbox drained"
