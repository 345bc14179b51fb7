"""The chunk service under a crowd: repeated requests are answered once, many devices asking at once get the
archive broadcast again instead of one copy each, and devices asking together for a small shared transfer get one
group publish."""

from __future__ import annotations

import time

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


def _published(sent, n, timeout=5.0):
    """Wait until the gathered requests' flush published ``n`` messages (it runs on the service's own thread)."""
    deadline = time.monotonic() + timeout
    while len(sent) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(sent) >= n, f"the gathered requests were never answered: {sent}"


def test_devices_asking_together_for_a_shared_transfer_get_one_group_publish_of_what_they_asked():
    service, sent = _service(coalesce_s=0.2)
    service.share("r1-w0", "cams")
    service.serve("cam0", "r1-w0", [0, 1])
    service.serve("cam1", "r1-w0", [1, 2])
    assert sent == [], "answered before the gathering window closed"
    _published(sent, 3)
    assert sent == [f"edgesdk/groups/cams/chunks/r1-w0/{i}" for i in range(3)]
    assert service.coalesced == 2 and service.coalesce_saved == 1 and not service.resent


def test_a_device_asking_alone_is_answered_on_its_own_topic_after_the_window():
    service, sent = _service(coalesce_s=0.05)
    service.share("r1-w0", "cams")
    service.serve("cam0", "r1-w0", [2, 0])
    _published(sent, 2)
    assert sent == ["edgesdk/devices/cam0/chunks/r1-w0/0", "edgesdk/devices/cam0/chunks/r1-w0/2"]
    assert service.coalesced == 0


def test_requests_for_a_big_archive_or_an_unshared_transfer_are_answered_at_once_one_by_one():
    service, sent = _service(coalesce_s=60.0, coalesce_max_bytes=len(DATA) - 1)
    service.share("r1-w0", "cams")
    service.serve("cam0", "r1-w0", [0])
    service.serve("cam1", "r1-w0", [0])
    assert sent == ["edgesdk/devices/cam0/chunks/r1-w0/0", "edgesdk/devices/cam1/chunks/r1-w0/0"]
    unshared, sent = _service(coalesce_s=60.0)
    unshared.serve("cam0", "r1-w0", [1])
    assert sent == ["edgesdk/devices/cam0/chunks/r1-w0/1"], "a transfer with no group was held back"


def test_a_full_broadcast_while_requests_are_gathered_is_not_sent_twice():
    service, sent = _service(coalesce_s=0.2)
    service.share("r1-w0", "cams")
    service.plan("r1-w0", [0, 1], "cams")
    service.serve("cam0", "r1-w0", [0, 1, 2])
    service.serve("cam1", "r1-w0", [1])
    service.broadcast("cams", "r1-w0")  # the stage's broadcast of its plan goes out meanwhile
    _published(sent, 3)
    time.sleep(0.3)  # past the window: nothing more comes
    assert sent[:2] == ["edgesdk/groups/cams/chunks/r1-w0/0", "edgesdk/groups/cams/chunks/r1-w0/1"]
    assert sent[2:] == ["edgesdk/devices/cam0/chunks/r1-w0/2"], "what the broadcast did not carry goes to its asker"


def test_closing_a_transfer_drops_its_gathered_requests():
    service, sent = _service(coalesce_s=0.05)
    service.share("r1-w0", "cams")
    service.serve("cam0", "r1-w0", [0])
    service.close("r1-w0")
    time.sleep(0.2)
    assert sent == [] and not service._gathered


def test_a_flush_that_fails_does_not_stop_later_ones():
    failing = [True]
    sent: list[str] = []

    def publish(topic, payload):
        if failing[0]:
            failing[0] = False
            raise OSError("the broker link dropped")
        sent.append(topic)

    service = ChunkDistributor(lambda name, version: (DATA, ArchiveInfo.of(DATA, 4096)), publish, coalesce_s=0.05)
    service.open("r1-w0", "digits", "2.0.0")
    service.share("r1-w0", "cams")
    service.serve("cam0", "r1-w0", [0])
    deadline = time.monotonic() + 5.0
    while failing[0] and time.monotonic() < deadline:
        time.sleep(0.01)
    service.serve("cam1", "r1-w0", [1])
    _published(sent, 1)
    assert sent == ["edgesdk/devices/cam1/chunks/r1-w0/1"], "the flusher died with the first failure"


def test_a_stage_transfer_is_not_gathered_its_stragglers_are_answered_one_by_one():
    """Thousands of a stage's devices may be downloading at once: a group publish would reach all of them."""
    service, sent = _service(coalesce_s=60.0)
    service.plan("r1-w0", [0, 1, 2], "cams")
    service.serve("cam0", "r1-w0", [0])
    service.serve("cam1", "r1-w0", [1])
    assert sent == ["edgesdk/devices/cam0/chunks/r1-w0/0", "edgesdk/devices/cam1/chunks/r1-w0/1"]


def test_late_devices_are_sent_what_they_lack_once_on_the_group_topic_when_the_last_one_accepted():
    """Late commands' chunks go without a request: once for all, as soon as every device accepted (subscribed)."""
    service, sent = _service(coalesce_s=0.05)
    service.share("r1-w0", "cams")
    assert service.gathers("r1-w0")
    service.expect("r1-w0", ["cam0", "cam1"], [0, 1, 2], wait_s=60.0)
    service.accepted("cam0", "r1", 3)
    service.accepted("cam1", "r2", 3)  # another deployment's command: not the one awaited
    time.sleep(0.2)
    assert sent == [], "sent before every device accepted (one may not be subscribed yet)"
    service.accepted("cam1", "r1", 3)
    _published(sent, 3)
    assert sent == [f"edgesdk/groups/cams/chunks/r1-w0/{i}" for i in range(3)]
    assert service.coalesced == 2 and not service.resent and not service._awaited


def test_late_chunks_go_after_the_wait_when_a_device_does_not_accept_and_not_to_a_device_that_lacks_none():
    service, sent = _service(coalesce_s=0.05)
    service.share("r1-w0", "cams")
    service.expect("r1-w0", ["cam0", "cam1", "cam2"], [0, 1], wait_s=0.3)
    service.accepted("cam0", "r1", 0)  # copied every chunk from its own slots
    service.accepted("cam1", "r1", 2)  # cam2 went offline again
    time.sleep(0.1)
    assert sent == []
    _published(sent, 2)
    assert sent == [f"edgesdk/groups/cams/chunks/r1-w0/{i}" for i in range(2)]
    assert service.coalesced == 2 and not service._awaited  # cam1 and cam2; cam2 asks later if it missed them

    lone, sent = _service(coalesce_s=0.05)
    lone.share("r1-w0", "cams")
    lone.expect("r1-w0", ["cam0"], [1], wait_s=60.0)
    lone.accepted("cam0", "r1", 1)
    _published(sent, 1)
    assert sent == ["edgesdk/devices/cam0/chunks/r1-w0/1"], "a lone device is answered on its own topic"

    nothing, sent = _service(coalesce_s=0.05)
    nothing.share("r1-w0", "cams")
    nothing.expect("r1-w0", ["cam0"], [0], wait_s=60.0)
    nothing.accepted("cam0", "r1", 0)
    time.sleep(0.2)
    assert sent == [], "chunks went to a device that lacked none"


def test_only_a_shared_small_archive_is_sent_without_requests():
    service, _ = _service(coalesce_s=0.05)
    assert not service.gathers("r1-w0"), "an unshared transfer (a running stage's) was gathered"
    big, _ = _service(coalesce_s=0.05, coalesce_max_bytes=len(DATA) - 1)
    big.share("r1-w0", "cams")
    assert not big.gathers("r1-w0"), "a big archive's chunks would go to every device downloading it"
    off, _ = _service(coalesce_s=0.0)
    off.share("r1-w0", "cams")
    assert not off.gathers("r1-w0") and not off.gathers("closed")


def test_a_device_awaited_for_two_releases_at_once_is_matched_by_its_deployment():
    service, sent = _service(coalesce_s=0.05)
    service.open("r2-w0", "detector", "1.0.0")
    for transfer_id in ("r1-w0", "r2-w0"):
        service.share(transfer_id, "cams")
        service.expect(transfer_id, ["cam0", "cam1"], [0], wait_s=60.0)
    service.accepted("cam0", "r2", 1)
    service.accepted("cam1", "r2", 1)
    _published(sent, 1)
    time.sleep(0.2)
    assert sent == ["edgesdk/groups/cams/chunks/r2-w0/0"], "the other release's chunks went, or these did not"
    assert service._awaited == {"cam0": {"r1-w0"}, "cam1": {"r1-w0"}}


def test_a_hostile_missing_count_in_an_accepted_event_counts_as_lacking():
    """``missing`` comes from the device: a wrong type, a 2**70 integer or a 10 MB string raises nothing and only
    means it lacks chunks; the deployment and device must still match."""
    for missing in (2**70, "x" * 10_000_000, None, [0], -1):
        service, sent = _service(coalesce_s=0.05)
        service.share("r1-w0", "cams")
        service.expect("r1-w0", ["cam0"], [0], wait_s=60.0)
        service.accepted("cam0", "r1-w0", missing)  # a transfer id where the deployment goes: not this one
        service.accepted("cam9", "r1", missing)  # a device nobody waits for
        time.sleep(0.1)
        assert sent == [], f"chunks went on a stranger's or a mismatched event ({type(missing).__name__})"
        service.accepted("cam0", "r1", missing)
        _published(sent, 1)
        assert sent == ["edgesdk/devices/cam0/chunks/r1-w0/0"]
