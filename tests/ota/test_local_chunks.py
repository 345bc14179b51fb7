"""Chunks read back from a device's own slots: every chunk of the archive a slot came in, rebuilt from its files."""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import replace

import numpy as np

from edgesdk.agent.local_chunks import LAYOUTS, LocalChunks, record_layout
from edgesdk.agent.store import ModelStore
from edgesdk.agent.transfer import IncomingTransfer
from edgesdk.fleet.archive import pack_bundle, unpack_bundle
from edgesdk.fleet.protocol import archive_info, parse_command, sign_command
from tests.ota.conftest import make_bundle


def _installed(tmp_path, keys, version="1.0.0", width=1024):
    """A store holding one slot installed from its archive (layout recorded), and that archive."""
    bundle = make_bundle(tmp_path / f"b{version}", version, keys, seed=5, width=width)
    data = pack_bundle(bundle)
    info = archive_info(data)
    store = ModelStore(tmp_path / "store")
    tar = tmp_path / f"{version}.tar"
    tar.write_bytes(data)
    slot = store.slot_name("digits", version)
    store.add_slot(slot, lambda tmp: unpack_bundle(tar, tmp))
    record_layout(store.root, slot, tar, info)
    return store, data, info, slot


def test_every_chunk_of_a_held_archive_is_rebuilt_from_the_slot(tmp_path, keys):
    store, data, info, _ = _installed(tmp_path, keys)
    local = LocalChunks(store.root)
    assert len(info.chunks) >= 3 and len(local) == len(set(info.chunks))
    for index, digest in enumerate(info.chunks):
        assert local.read(digest) == data[slice(*info.chunk_range(index))]
    assert local.read("0" * 64) is None


def test_a_layout_whose_slot_is_gone_or_broken_offers_nothing(tmp_path, keys):
    store, _, info, slot = _installed(tmp_path, keys)
    (store.root / LAYOUTS / "broken.json").write_text("{not json")
    assert len(LocalChunks(store.root)) == len(set(info.chunks))  # the broken layout is skipped, not fatal
    shutil.rmtree(store.slots / slot)
    assert len(LocalChunks(store.root)) == 0


def _command(keys, info, version="2.0.0"):
    return parse_command(sign_command(keys["server"], type="deploy", deployment_id="d2", transfer_id="t2",
                                      name="digits", version=version, group="g", archive=info), keys["server_pub"])


def test_a_transfer_takes_the_chunks_the_device_holds_and_only_those(tmp_path, keys):
    store, data, info, _ = _installed(tmp_path, keys)
    # The new version: same bytes with its second half changed.
    half = len(data) // 2
    new = data[:half] + np.random.default_rng(1).integers(0, 256, len(data) - half, dtype=np.uint8).tobytes()
    new_info = archive_info(new)
    transfer = IncomingTransfer(store.incoming, _command(keys, new_info))
    copied = transfer.fill(LocalChunks(store.root))
    shared = sum(digest in set(info.chunks) for digest in new_info.chunks)
    assert copied == transfer.local_chunks == shared >= 1 and transfer.local_corrupt == 0
    assert transfer.local_bytes == sum(new_info.sizes[i] for i, d in enumerate(new_info.chunks) if d in set(info.chunks))
    for index in transfer.missing():
        assert transfer.accept(index, new[slice(*new_info.chunk_range(index))])
    assert transfer.complete and transfer.finish().read_bytes() == new
    assert transfer.fetched_bytes == len(new) - transfer.local_bytes


def test_a_corrupted_local_chunk_is_detected_and_left_to_fetch(tmp_path, keys):
    store, data, info, slot = _installed(tmp_path, keys)
    model = store.slots / slot / "model.onnx"
    os.chmod(model, 0o644)
    with open(model, "r+b") as f:  # flip one byte in the middle of the weights
        f.seek(model.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    same = replace(info, sha256=info.sha256)  # the same archive again, under a new version
    transfer = IncomingTransfer(store.incoming, _command(keys, same))
    transfer.fill(LocalChunks(store.root))
    assert transfer.local_corrupt == 1 and len(transfer.missing()) == 1
    [index] = transfer.missing()
    assert hashlib.sha256(data[slice(*info.chunk_range(index))]).hexdigest() == info.chunks[index]
    assert transfer.accept(index, data[slice(*info.chunk_range(index))])
    assert transfer.finish().read_bytes() == data
