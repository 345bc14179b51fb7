"""Runtime guards on a real onnxruntime model: the note for a bundle planned for another board, and non-finite inputs."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from edgesdk import Runtime
from edgesdk.errors import InputError
from edgesdk.runtime.bundle import BundleSpec
from edgesdk.runtime.bundling import bundle_from_model
from edgesdk.runtime.detect import detect_device
from edgesdk.testing import random_mlp, write_mlp_onnx

NOTE = "were planned for"


@pytest.fixture(scope="module")
def host():
    return detect_device()


@pytest.fixture(scope="module")
def mlp_onnx(tmp_path_factory):
    return write_mlp_onnx(random_mlp([8, 16, 4]), tmp_path_factory.mktemp("mlp") / "mlp.onnx")


def _bundle(tmp_path, model, target, host):
    spec = BundleSpec("guards", "1.0.0", "fp32", target, "latency")
    sample = {"input": np.ones((1, 8), np.float32)}
    # The sample runs under the host's profile so building it logs nothing about boards.
    return bundle_from_model(tmp_path / target, model, spec, sample, profile=host)


def _notes(caplog):
    return [r for r in caplog.records if r.levelno == logging.WARNING and NOTE in r.getMessage()]


def test_a_bundle_for_another_board_logs_one_note_across_load_and_predicts(tmp_path, mlp_onnx, host, caplog):
    other = "rk3588" if host.name == "raspberry-pi-5" else "raspberry-pi-5"
    bundle = _bundle(tmp_path, mlp_onnx, other, host)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edgesdk.runtime"), Runtime(bundle.path) as rt:
        for _ in range(3):
            rt.predict(np.ones((2, 8), np.float32))
    notes = _notes(caplog)
    assert len(notes) == 1, [r.getMessage() for r in caplog.records]
    message = notes[0].getMessage()
    assert notes[0].name.startswith("edgesdk.runtime")
    assert other in message and f"this host detects as {host.name}" in message


@pytest.mark.parametrize("own", [True, False], ids=["own-profile", "generic-of-this-arch"])
def test_no_note_for_the_own_or_a_generic_profile_of_this_architecture(tmp_path, mlp_onnx, host, caplog, own):
    target = host.name if own else f"generic-{host.arch}"
    bundle = _bundle(tmp_path, mlp_onnx, target, host)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edgesdk.runtime"), Runtime(bundle.path, profile=host) as rt:
        rt.predict(np.ones((1, 8), np.float32))
    assert _notes(caplog) == []


def test_a_generic_bundle_of_another_architecture_is_another_board(tmp_path, mlp_onnx, host, caplog):
    other_arch = "aarch64" if host.arch != "aarch64" else "x86_64"
    bundle = _bundle(tmp_path, mlp_onnx, f"generic-{other_arch}", host)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edgesdk.runtime"), Runtime(bundle.path, profile=host):
        pass
    (note,) = _notes(caplog)
    assert f"generic-{other_arch}" in note.getMessage() and f"CPU {other_arch} vs {host.arch}" in note.getMessage()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_check_finite_refuses_nan_and_inf_naming_the_input(mlp_onnx, host, bad):
    x = np.ones((2, 8), np.float32)
    x[0, 3] = x[1, 5] = bad
    with Runtime(mlp_onnx, profile=host, check_finite=True) as rt:
        with pytest.raises(InputError, match=r"input 'input' has 2 non-finite value\(s\) of 16.*check_finite=False"):
            rt.predict(x)
        with pytest.raises(InputError, match="'input'"):
            rt.predict({"input": x})
        assert rt.stats().errors == 2
        rt.predict(np.ones((2, 8), np.float32))  # finite inputs still run


def test_check_finite_is_on_by_default_and_false_lets_non_finite_through(mlp_onnx, host):
    x = np.full((1, 8), np.nan, np.float32)
    with Runtime(mlp_onnx, profile=host) as rt, pytest.raises(InputError, match="8 NaN, 0 Inf"):
        rt.predict(x)
    with Runtime(mlp_onnx, profile=host, check_finite=False) as rt:
        assert np.isnan(rt.predict(x)).all()


def test_integer_inputs_are_not_checked(tmp_path, host):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["tokens"], ["as_float"], to=TensorProto.FLOAT)], "cast",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", 4])],
        [helper.make_tensor_value_info("as_float", TensorProto.FLOAT, ["batch", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "cast.onnx"
    onnx.save(model, path)
    tokens = np.array([[0, -1, np.iinfo(np.int64).max, 7]], np.int64)
    with Runtime(path, profile=host, check_finite=True) as rt:
        np.testing.assert_array_equal(rt.predict(tokens), tokens.astype(np.float32))


def test_managed_runtime_passes_check_finite_to_every_runtime_it_loads(tmp_path, mlp_onnx, host):
    from edgesdk import ManagedRuntime

    bundle = _bundle(tmp_path, mlp_onnx, host.name, host)
    x = np.full((1, 8), np.inf, np.float32)
    with ManagedRuntime(bundle.path, profile=host) as managed, pytest.raises(InputError, match="'input'"):
        managed.predict(x)
    with ManagedRuntime(bundle.path, profile=host, check_finite=False) as managed:
        managed.predict(x)


def test_predict_async_checks_before_it_routes_so_nan_never_reaches_the_cloud(mlp_onnx, host):
    from edgesdk.offload.policy import OffloadPolicy
    from edgesdk.ota_server.broker import free_port

    policy = OffloadPolicy(f"http://127.0.0.1:{free_port()}", "mlp")  # nobody listens: routing is not the point
    x = np.full((1, 8), np.nan, np.float32)
    with Runtime(mlp_onnx, profile=host, offload=policy) as rt, pytest.raises(InputError, match="8 NaN"):
        rt.predict_async(x)  # refused at submit, before a local or cloud route is chosen
    with Runtime(mlp_onnx, profile=host, offload=policy, check_finite=False) as rt:
        assert np.isnan(rt.predict_async(x).result(timeout=30)).all()
