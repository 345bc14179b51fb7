"""Runtime against real onnxruntime and LiteRT interpreters, on locally trained models."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk import Runtime
from edgesdk.errors import BackendError, InputError, ModelFormatError, ScheduleError
from edgesdk.testing import mlp_forward


@pytest.fixture(params=["onnx", "tflite"])
def digits_model(request, digits_onnx, digits_tflite):
    return {"onnx": digits_onnx, "tflite": digits_tflite}[request.param]


def test_predictions_match_the_numpy_reference_and_classify_digits(digits_model, digits, digits_mlp, host_big_little):
    with Runtime(digits_model, profile=host_big_little) as rt:
        probs = rt.predict(digits.x_test)
    reference = mlp_forward(digits_mlp, digits.x_test)
    assert probs.shape == (len(digits.x_test), 10)
    np.testing.assert_allclose(probs, reference, atol=1e-5)
    assert (probs.argmax(1) == digits.y_test).mean() > 0.93


def test_backend_is_chosen_from_the_format_and_recorded(digits_onnx, digits_tflite, host_big_little):
    with Runtime(digits_onnx, profile=host_big_little) as rt:
        assert (rt.info.backend, rt.info.accelerator) == ("onnxruntime", "CPUExecutionProvider")
    with Runtime(digits_tflite, profile=host_big_little) as rt:
        assert (rt.info.backend, rt.info.accelerator) == ("litert", "xnnpack")
        assert rt.info.backend_version.startswith("ai-edge-litert")


def test_signatures_are_typed_with_dynamic_batch(digits_model, host_big_little):
    with Runtime(digits_model, profile=host_big_little) as rt:
        (inp,), (out,) = rt.inputs, rt.outputs
    assert (inp.name, inp.shape, inp.dtype) == ("input", (None, 64), np.dtype(np.float32))
    assert (out.name, out.shape, out.dtype) == ("probabilities", (None, 10), np.dtype(np.float32))


def test_batch_size_can_change_between_calls(digits_model, digits, host_big_little):
    with Runtime(digits_model, profile=host_big_little) as rt:
        one = rt.predict(digits.x_test[:1])
        many = rt.predict(digits.x_test[:7])
        again = rt.predict({"input": digits.x_test[:1]})
    assert one.shape == (1, 10) and many.shape == (7, 10)
    np.testing.assert_allclose(one, again)
    np.testing.assert_allclose(one, many[:1], atol=1e-6)


def test_mode_sets_threads_and_cores(digits_model, host_big_little):
    big, little = host_big_little.cluster("big").cores, host_big_little.cluster("little").cores
    with Runtime(digits_model, profile=host_big_little, mode="latency") as rt:
        assert (rt.info.cores, rt.info.threads, rt.info.power_mode) == (big, 1, "performance")
    with Runtime(digits_model, profile=host_big_little, mode="power") as rt:
        assert (rt.info.cores, rt.info.threads, rt.info.power_mode) == (little, 1, "efficiency")


def test_stats_count_calls_errors_and_latency(digits_model, digits, host_big_little):
    with Runtime(digits_model, profile=host_big_little) as rt:
        for i in range(20):
            rt.predict(digits.x_test[i : i + 1])
        with pytest.raises(InputError):
            rt.predict(digits.x_test[:1].astype(np.float64))
        snap = rt.stats()
    assert snap.count == 21 and snap.errors == 1 and snap.window == 20
    assert 0 < snap.p50_ms <= snap.p95_ms <= snap.p99_ms


@pytest.mark.parametrize(
    ("bad", "pattern"),
    [
        (np.zeros((1, 64), np.float64), "expects dtype float32, got float64"),
        (np.zeros((1, 63), np.float32), r"wrong shape.*got shape \(1, 63\)"),
        (np.zeros((64,), np.float32), r"wrong rank.*got shape \(64,\)"),
        ({"pixels": np.zeros((1, 64), np.float32)}, r"missing \['input'\], unexpected \['pixels'\]"),
    ],
    ids=["dtype", "shape", "rank", "name"],
)
def test_bad_input_is_rejected_before_the_backend(digits_model, host_big_little, bad, pattern):
    with Runtime(digits_model, profile=host_big_little) as rt, pytest.raises(InputError, match=pattern):
        rt.predict(bad)


def test_closed_runtime_refuses_to_predict(digits_model, digits, host_big_little):
    rt = Runtime(digits_model, profile=host_big_little)
    rt.close()
    rt.close()
    with pytest.raises(BackendError, match="closed"):
        rt.predict(digits.x_test[:1])


@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_truncated_model_is_a_format_error(tmp_path, digits_model, host_big_little, keep):
    data = digits_model.read_bytes()
    path = tmp_path / f"truncated{digits_model.suffix}"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelFormatError, match="corrupt or truncated"):
        Runtime(path, profile=host_big_little)


def test_corrupt_onnx_bytes_are_a_format_error(tmp_path, host_big_little):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(ModelFormatError, match="garbage.onnx: onnxruntime cannot load"):
        Runtime(path, profile=host_big_little)


def test_backend_that_cannot_run_the_format_says_what_to_do(digits_onnx, host_big_little):
    with pytest.raises(BackendError, match="backend 'litert' cannot run onnx model.*backend='onnxruntime'"):
        Runtime(digits_onnx, profile=host_big_little, backend="litert")


def test_unknown_backend_mode_and_accelerator(digits_onnx, host_big_little):
    with pytest.raises(BackendError, match="unknown backend 'tensorrt'"):
        Runtime(digits_onnx, profile=host_big_little, backend="tensorrt")
    with pytest.raises(ScheduleError, match="unknown mode 'fast'"):
        Runtime(digits_onnx, profile=host_big_little, mode="fast")
    with pytest.raises(BackendError, match=r"no accelerator 'npu0'.*\['auto', 'cpu', 'gpu', 'npu', 'dsp'\]"):
        Runtime(digits_onnx, profile=host_big_little, accelerator="npu0")


def test_multi_output_models_return_a_dict(tmp_path, host_big_little):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["pos"]), helper.make_node("Neg", ["x"], ["neg"])], "two", [x],
        [helper.make_tensor_value_info("pos", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("neg", TensorProto.FLOAT, [2])],
    )
    path = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with Runtime(path, profile=host_big_little) as rt:
        out = rt.predict(np.array([-1.0, 2.0], np.float32))
    assert set(out) == {"pos", "neg"}
    np.testing.assert_array_equal(out["neg"], [1.0, -2.0])
