"""Security benchmark part "rollback floor and root hygiene" (issue 36, parts 5-6), in this process, no broker.

    python benchmarks/security/security_trust.py [--quick]

**Rollbacks below the floor**: a device store holds a committed release 3.0.0 whose manifest, signed by the
bundles key, carries ``rollback_floor: 2.0.0``. Commands signed by the commands key (what its thief can send)
try to run every version 1.0.0 .. 1.N.0 (N = 200, 50 with ``--quick``) as a rollback, a deploy with
``rollback`` set and a revert; each is weighed by :func:`edgesdk.agent.admission.admit` as the agent does.
Reported: how many were admitted (goal 0) and how many rollbacks at or above the floor were (all should be).

**Pending roots**: a device on root v1 receives 400 root documents of an attacker's own keys (self-signed, so
they pass their own threshold) for versions 3..402. Reported: the documents held and their bytes (goal at most
8 and 512 KiB; before issue 36 all 400 were held).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from benchmarks.shared.common import goal, log  # noqa: E402
from edgesdk.agent.admission import admit  # noqa: E402
from edgesdk.agent.store import ModelStore  # noqa: E402
from edgesdk.agent.trust_keeper import TrustKeeper  # noqa: E402
from edgesdk.fleet.protocol import ArchiveInfo, parse_command, sign_command  # noqa: E402
from edgesdk.fleet.trust import ROLES, new_root, sign_metadata  # noqa: E402
from edgesdk.runtime.bundle import BundleSpec, HealthCheck  # noqa: E402
from edgesdk.runtime.bundling import bundle_from_model  # noqa: E402
from edgesdk.runtime.signing import KeySet  # noqa: E402
from edgesdk.testing import random_mlp, write_mlp_onnx  # noqa: E402

YEAR = 365 * 86400.0


def _floored_store(work: Path, bundles_key: Ed25519PrivateKey) -> ModelStore:
    import numpy as np

    model = write_mlp_onnx(random_mlp([64, 16, 10], seed=3), work / "model.onnx")
    spec = BundleSpec("digits", "3.0.0", "onnx-fp32", "generic-x86_64", "latency", rollback_floor="2.0.0",
                      health_check=HealthCheck(atol=1e-4, rtol=1e-3))
    bundle = bundle_from_model(work / "bundle", model, spec, {"input": np.zeros((1, 64), np.float32)},
                               private_key=bundles_key)
    store = ModelStore(work / "store")
    keys = KeySet.of([bundles_key.public_key()])
    for version in ["1.0.0", "2.0.0"] + [f"1.{i}.0" for i in range(1, 300)]:
        (store.slots / f"digits-{version}").mkdir(parents=True, exist_ok=True)  # held slots (contents never read)
    store.add_slot("digits-3.0.0", lambda tmp: shutil.copytree(bundle.path, tmp, dirs_exist_ok=True), keys)
    state = store.load_state()
    state.committed = "digits-3.0.0"
    store.save_state(state)
    store.set_pointer("current", "digits-3.0.0")
    return store


def rollbacks_below_floor(quick: bool) -> dict[str, Any]:
    """Hostile commands below the floor and honest ones at or above it, weighed by admit()."""
    commands_key, bundles_key = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    n = 50 if quick else 200
    with tempfile.TemporaryDirectory() as tmp:
        store = _floored_store(Path(tmp), bundles_key)
        admitted = tried = 0
        started = time.perf_counter()
        for i in range(n):
            version = f"1.{i}.0"
            for kind in ("rollback", "deploy-rollback", "revert"):
                deploy = kind == "deploy-rollback"
                envelope = sign_command(commands_key, type="deploy" if deploy else "rollback",
                                        deployment_id=f"{kind}-{i}", transfer_id=f"{kind}-{i}", name="digits",
                                        version=version, group="cams", rollback=kind != "revert",
                                        reverts="3.0.0" if kind == "revert" else None,
                                        archive=ArchiveInfo.of(b"x" * 100, chunk_size=4096) if deploy else None)
                command = parse_command(envelope, commands_key.public_key())
                verdict = admit(command, store.load_state(), ("digits", "3.0.0"), "digits-3.0.0", in_flight=False,
                                resume=False, held=True, store=store)
                tried += 1
                admitted += verdict.proceed
        per_command_ms = (time.perf_counter() - started) * 1e3 / tried
        honest = 0
        for version in ("2.0.0",):
            command = parse_command(sign_command(commands_key, type="rollback", deployment_id="ok", transfer_id="ok",
                                                 name="digits", version=version, group="cams", rollback=True),
                                    commands_key.public_key())
            honest += admit(command, store.load_state(), ("digits", "3.0.0"), "digits-3.0.0", in_flight=False,
                            resume=False, held=True, store=store).proceed
    return {"tried_below_floor": tried, "admitted_below_floor": admitted, "admitted_at_floor": honest,
            "admission_ms_per_command": round(per_command_ms, 3)}


def pending_roots(count: int = 400) -> dict[str, Any]:
    """Hostile self-signed roots v3.. flooding a device on v1."""
    fleet = {role: [Ed25519PrivateKey.generate()] for role in ROLES}
    attacker = [Ed25519PrivateKey.generate()]
    with tempfile.TemporaryDirectory() as tmp:
        root = sign_metadata(new_root(1, time.time() + YEAR, {r: ([k.public_key() for k in fleet[r]], 1)
                                                               for r in ROLES}), fleet["root"])
        (Path(tmp) / "root.json").write_bytes(root)
        keeper = TrustKeeper(Path(tmp) / "trust", Path(tmp) / "root.json", "bench")
        sent = 0
        for version in range(3, 3 + count):
            document = sign_metadata(new_root(version, time.time() + YEAR, {
                r: ([k.public_key() for k in attacker], 1) for r in ROLES}), attacker)
            sent += len(document)
            keeper.receive(document)
        held = keeper._pending
        return {"roots_sent": count, "bytes_sent": sent, "roots_held": len(held),
                "bytes_held": sum(len(d) for d in held.values()),
                "files_in_trust_dir": sorted(p.name for p in (Path(tmp) / "trust").iterdir())}


def run(quick: bool) -> dict[str, Any]:
    """Both parts; ``{"results", "goals"}``."""
    log("rollback floor: hostile signed rollbacks below the floor")
    floor = rollbacks_below_floor(quick)
    log("pending roots: 400 hostile root documents")
    pending = pending_roots()
    goals = [goal("signed rollbacks below the floor admitted", "0", floor["admitted_below_floor"],
                  floor["admitted_below_floor"] == 0),
             goal("a rollback at the floor admitted", "1", floor["admitted_at_floor"], floor["admitted_at_floor"] == 1),
             goal("root documents held after 400 hostile ones", "<= 8", pending["roots_held"],
                  pending["roots_held"] <= 8),
             goal("bytes held after 400 hostile roots", "<= 524288", pending["bytes_held"],
                  pending["bytes_held"] <= 512 * 1024)]
    return {"results": {"rollback_floor": floor, "pending_roots": pending}, "goals": goals}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    print(json.dumps(run(parser.parse_args().quick), indent=2))
