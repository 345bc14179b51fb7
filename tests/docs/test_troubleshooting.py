"""docs/troubleshooting.md quotes the real messages: each is produced here and compared with the page."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import edgesdk.errors as errors
from edgesdk import Runtime
from edgesdk.fleet.transport import MqttTransport, load_credentials
from edgesdk.ota_server.broker import LocalMosquitto, free_port
from edgesdk.runtime.bundle import BundleSpec, read_bundle
from edgesdk.runtime.bundling import bundle_from_model
from edgesdk.runtime.signing import generate_keypair, load_public_key
from edgesdk.testing import random_mlp, write_mlp_onnx

PAGE = Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md"


def _quoted() -> dict[str, str]:
    """Each ``<!-- error: ID -->`` of the page and the text block under it."""
    found = re.findall(r"<!-- error: ([\w-]+) -->\n```text\n(.*?)\n```", PAGE.read_text(), flags=re.S)
    return dict(found)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_mlp_onnx(random_mlp([64, 16, 2]), tmp_path_factory.mktemp("trouble") / "model.onnx")


def _message(call) -> str:
    with pytest.raises(errors.EdgeSDKError) as caught:
        call()
    return str(caught.value)


def _wrong_input(model: Path, value) -> str:
    with Runtime(model, profile="generic-x86_64") as runtime:
        return _message(lambda: runtime.predict(value))


def _truncated(tmp_path: Path) -> str:
    (tmp_path / "model.onnx").write_bytes(b"garbage")
    return _message(lambda: Runtime(tmp_path / "model.onnx", profile="generic-x86_64")).replace(f"{tmp_path}/", "")


def _unsigned(model: Path, tmp_path: Path) -> str:
    spec = BundleSpec("vibration", "1.0.0", "onnx-fp32", "generic-x86_64", "power")
    bundle_from_model(tmp_path / "bundle", model, spec, {"input": np.zeros((1, 64), np.float32)})
    generate_keypair(tmp_path, "converter")
    key = load_public_key(tmp_path / "converter.pub")
    return _message(lambda: read_bundle(tmp_path / "bundle", public_key=key, require_signature=True))


def _broker_refused(tmp_path: Path) -> str:
    port = free_port()
    broker = LocalMosquitto(tmp_path / "broker", port=port,
                            conf_lines=[f"listener {port} 127.0.0.1", "allow_anonymous false", "persistence false"])
    try:
        return _message(lambda: MqttTransport(broker.url, "edgesdk-agent-cam01", username="cam01", password="wrong",
                                              connect_timeout=10).close()).replace(str(port), "PORT")
    finally:
        broker.stop()


def _other_device(tmp_path: Path) -> str:
    (tmp_path / "cam02.json").write_text(json.dumps({"device_id": "cam02", "username": "cam02", "password": "x"}))
    return _message(lambda: load_credentials(tmp_path / "cam02.json", "cam01")).replace(f"{tmp_path}/", "")


def _refused_group(tmp_path: Path, provisioned: bool) -> str:
    """What the server logs when cam01's report names group lobby and cam01 is in cams (or in no group at all,
    under --require-provisioning)."""
    import logging
    import time

    from edgesdk.ota_server.devices.provisioning import GroupGuard
    from edgesdk.ota_server.store.fleet_db import DeviceState, FleetDB

    db = FleetDB(tmp_path / "fleet.db")
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("edgesdk.ota_server.server")
    logger.addHandler(handler)
    try:
        if provisioned:
            db.provision({"cam01": "cams"}, "devices file")
        guard = GroupGuard(db, require_provisioning=not provisioned)
        assert guard.admit([DeviceState("cam01", "lobby", "online", None, None, (), time.time())]) == []
    finally:
        logger.removeHandler(handler)
        db.close()
    (message,) = messages
    return message


def _fallback(model: Path) -> str:
    with Runtime(model, profile="raspberry-pi-5", accelerator="npu") as runtime:
        return runtime.info.fallbacks[-1]


def _rollback_refused(ran: tuple[str, ...], to: str) -> str:
    """The rollback rules' refusal of rolling group cams back from its release (the last of ``ran``) to ``to``."""
    from edgesdk.fleet.records import RolloutPolicy, RolloutRecord, RolloutState
    from edgesdk.ota_server.rollouts.analysis.rollback_rules import GroupHistory, plan_rollback

    release = RolloutRecord("r9", "digits", ran[-1], "cams", RolloutPolicy(), RolloutState.COMPLETED, 0, None, None,
                            None, 0.0, 0.0, False)
    return _message(lambda: plan_rollback(release, GroupHistory("cams", "digits", ran, "r9", ran[-1]), to))


def _inconclusive() -> str:
    """What `push --wait` says when the canary's two devices made too few calls on the release by its deadline."""
    from edgesdk.cli.fleet import _outcome
    from edgesdk.fleet.records import RolloutPolicy, RolloutRecord, RolloutState
    from edgesdk.fleet.records import TargetStatus as Status
    from edgesdk.ota_server.rollouts.analysis.evidence import StageDevice
    from edgesdk.ota_server.rollouts.analysis.stage import judge_stage

    now = 1_800_000_000.0
    figures = {"from": now - 60, "to": now, "calls": 30, "errors": 0, "p50_ms": 4.0, "p95_ms": 5.0, "p99_ms": 6.0,
               "local": 0, "cloud": 0, "apps": 1, "starts": 1, "restarts": 0}
    devices = [StageDevice(d, "rk3588", Status.COMMITTED, None, "1.0.0", True, now - 5, now - 90,
                           {"traffic": {"format": 1, "at": now, "horizon_s": 900, "versions": {"2.0.0": figures}}})
               for d in ("cam01", "cam02")]
    verdict, _ = judge_stage(RolloutPolicy(), 0, "2.0.0", devices, [], None, now, final=True)
    paused = RolloutRecord("r9", "digits", "2.0.0", "cams", RolloutPolicy(), RolloutState.RUNNING, 0, now - 200,
                           now - 190, None, now - 300, now, False, stage_sizes=(2, 20), verdict=verdict)
    return _message(lambda: _outcome(paused))


CASES = {
    "wrong-shape": lambda model, tmp: _wrong_input(model, np.zeros((1, 32), np.float32)),
    "wrong-dtype": lambda model, tmp: _wrong_input(model, np.zeros((1, 64), np.float64)),
    "wrong-names": lambda model, tmp: _wrong_input(model, {"x": np.zeros((1, 64), np.float32)}),
    "truncated-model": lambda model, tmp: _truncated(tmp),
    "unsigned-bundle": _unsigned,
    "unknown-profile": lambda model, tmp: _message(lambda: Runtime(model, profile="rpi5")),
    "broker-refused": lambda model, tmp: _broker_refused(tmp),
    "credentials-of-another-device": lambda model, tmp: _other_device(tmp),
    "no-delegate": lambda model, tmp: _fallback(model),
    "wrong-group": lambda model, tmp: _refused_group(tmp, provisioned=True),
    "unprovisioned": lambda model, tmp: _refused_group(tmp, provisioned=False),
    "unknown-accelerator": lambda model, tmp: _message(lambda: Runtime(model, profile="raspberry-pi-5",
                                                                       accelerator="hailo")),
    "rollback-never-ran": lambda model, tmp: _rollback_refused(("1.0.0", "2.0.0", "3.0.0"), "9.9.9"),
    "rollback-forward": lambda model, tmp: _rollback_refused(("1.0.0", "2.0.0", "3.0.0", "2.0.0"), "3.0.0"),
    "inconclusive": lambda model, tmp: _inconclusive(),
}


def test_every_quoted_message_has_a_case():
    assert sorted(_quoted()) == sorted(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_page_quotes_the_real_message(case, model, tmp_path):
    assert CASES[case](model, tmp_path) == _quoted()[case]


def test_the_exit_code_table_matches_the_error_classes():
    table = PAGE.read_text().split("<!-- exit-codes -->")[1].split("\n\n")[0]
    rows = {name: int(code) for code, name in re.findall(r"^\| (\d+) \| `(\w+)` \|", table, flags=re.M)}
    classes = {name: cls.exit_code for name in errors.__all__ if isinstance(cls := getattr(errors, name), type)}
    assert rows == classes
