"""benchmarks/converter/nncf_peer.py and nncf_worker.py: NNCF's accuracy control as the quantization benchmark's peer.

The worker's metrics and target handling, and the peer's error paths, run in edgesdk's own
environment (the worker imports only numpy until it runs). The end-to-end run needs NNCF's
virtualenv: it is marked slow and runs only where that environment is already installed
(``NncfEnv().ensure()``, or one run of the benchmark), so the suite never installs it (460 MB).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.converter import nncf_worker as worker
from benchmarks.converter.nncf_peer import REQUIREMENTS, NncfEnv, NncfError, _save_targets, nncf_accuracy_control


def logits(classes: list[int], n_classes: int = 4) -> list[list[np.ndarray]]:
    """Per-sample session outputs (batch 1) whose argmax is ``classes``."""
    return [[np.eye(n_classes, dtype=np.float32)[c][None]] for c in classes]


def test_top1_agreement_with_labels_references_and_fp32_outputs():
    outputs = logits([0, 1, 2, 3])
    assert worker.top1_agreement(outputs, np.array([0, 1, 2, 0])) == (0.75, [1.0, 1.0, 1.0, 0.0])
    reference = np.eye(4, dtype=np.float32)[[0, 1, 0, 3]]
    assert worker.top1_agreement(outputs, reference)[0] == 0.75
    assert worker.top1_agreement(outputs, [reference])[0] == 0.75  # several reference outputs: output 0 counts
    assert worker.top1_agreement(outputs, worker.PerSample(logits([0, 1, 2, 2])))[0] == 0.75
    segmentation = [[np.zeros((1, 3, 2, 2), np.float32)]]  # class 0 everywhere; the label agrees at 3 of 4 pixels
    assert worker.top1_agreement(segmentation, np.array([[[0, 0], [0, 1]]]))[0] == 0.75


def test_targets_are_sliced_by_sample_in_every_form():
    labels = np.arange(5) * 10
    assert worker.slice_targets(labels, [3, 1]).tolist() == [30, 10]
    assert [t.tolist() for t in worker.slice_targets([labels, -labels], [4])] == [[40], [-40]]
    assert worker.slice_targets({"a": labels}, [0, 2])["a"].tolist() == [0, 20]
    per_sample = worker.slice_targets(worker.PerSample(["s0", "s1", "s2"]), [2, 0])
    assert isinstance(per_sample, worker.PerSample) and per_sample == ["s2", "s0"]


def test_saved_targets_load_as_they_were_given(tmp_path):
    labels, outputs, boxes = np.arange(3), [np.ones((3, 2)), np.zeros(3)], {"boxes": np.ones((3, 4))}
    assert np.array_equal(worker._load_targets(_save_targets(labels, tmp_path)), labels)
    loaded = worker._load_targets(_save_targets(outputs, tmp_path))
    assert isinstance(loaded, list) and all(np.array_equal(a, b) for a, b in zip(loaded, outputs))
    loaded = worker._load_targets(_save_targets(boxes, tmp_path))
    assert loaded.keys() == boxes.keys() and np.array_equal(loaded["boxes"], boxes["boxes"])
    assert worker._load_targets(_save_targets(None, tmp_path)) is None


def test_a_metric_file_gives_the_value_and_per_sample_values(tmp_path):
    path = tmp_path / "metric.py"
    path.write_text("import numpy as np\n"
                    "def validate(session_outputs_list, targets):\n"
                    "    return float(np.mean([o[0].argmax() == t for o, t in zip(session_outputs_list, targets)]))\n")
    metric = worker.load_metric("my_metric", str(path))
    assert metric(logits([0, 1, 2]), np.array([0, 1, 1])) == (pytest.approx(2 / 3), [1.0, 1.0, 0.0])
    path.write_text("def validate(outputs, targets):\n    return 0.5, [0.0, 1.0]\n")
    assert worker.load_metric("pair", str(path))(logits([0, 1]), None) == (0.5, [0.0, 1.0])
    path.write_text("x = 1\n")
    with pytest.raises(ValueError, match="defines no validate"):
        worker.load_metric("none", str(path))
    with pytest.raises(ValueError, match="unknown metric 'f1'"):
        worker.load_metric("f1", None)


def fake_env(tmp_path: Path) -> NncfEnv:
    """An 'installed' environment whose Python is this one, which has no nncf: the worker fails importing it."""
    env = NncfEnv(tmp_path / "venv")
    (env.location / "bin").mkdir(parents=True)
    env.python.symlink_to(sys.executable)
    env.marker.write_text(json.dumps({"requirements": list(REQUIREMENTS)}))
    assert env.installed and env.ensure() is None
    return env


def test_a_failing_worker_raises_with_its_stderr_tail(tmp_path):
    x = {"input": np.zeros((2, 1, 8, 8), np.float32)}
    env = fake_env(tmp_path)
    with pytest.raises(NncfError, match=r"failed \(exit 1\)(.|\n)*No module named 'nncf'"):
        nncf_accuracy_control(tmp_path / "m.onnx", x, x, None, "top1_agreement", 0.01, tmp_path / "q.onnx",
                              timeout_s=120, env=env)
    assert not (tmp_path / "q.onnx").exists()
    with pytest.raises(ValueError, match="unknown metric 'f1'"):
        nncf_accuracy_control(tmp_path / "m.onnx", x, x, None, "f1", 0.01, tmp_path / "q.onnx", env=env)


def test_a_worker_out_of_time_is_killed_and_says_so(tmp_path):
    x = {"input": np.zeros((2, 1, 8, 8), np.float32)}
    env = fake_env(tmp_path)
    env.python.unlink()
    env.python.write_text("#!/bin/sh\necho started; exec sleep 60\n")
    env.python.chmod(0o755)
    with pytest.raises(NncfError, match="did not finish within 0.5 s") as caught:
        nncf_accuracy_control(tmp_path / "m.onnx", x, x, None, "top1_agreement", 0.01, tmp_path / "q.onnx",
                              timeout_s=0.5, env=env)
    assert caught.value.timed_out and "started" in caught.value.log_tail


def test_a_changed_requirement_means_not_installed(tmp_path):
    env = fake_env(tmp_path)
    assert not NncfEnv(env.location, requirements=(*REQUIREMENTS[:-1], "numpy==1.26.4")).installed


@pytest.mark.slow
@pytest.mark.skipif(not NncfEnv().installed, reason="NNCF's virtualenv is not installed (NncfEnv().ensure())")
def test_nncf_quantizes_a_digits_cnn_within_one_point(tmp_path):
    import onnx
    import onnxruntime as ort
    import torch

    from edgesdk.converters.formats.onnx_model import export_torch
    from edgesdk.testing import digits_cnn, load_digits_data

    data = load_digits_data()
    fp32 = export_torch(digits_cnn(data, epochs=10), [torch.zeros(1, 1, 8, 8)], tmp_path / "digits.onnx",
                        output_names=["logits"], dynamic_batch=True)
    x_test = data.x_test.reshape(-1, 1, 8, 8)
    result = nncf_accuracy_control(fp32, {"input": data.x_train.reshape(-1, 1, 8, 8)[:256]}, {"input": x_test},
                                   data.y_test, "top1_agreement", 0.01, tmp_path / "nncf.onnx", timeout_s=240)
    assert result.nncf_version == REQUIREMENTS[0].split("==")[1] and result.within_bound
    assert result.quantize_linear > 0 and result.wall_s < 240
    assert result.final_drop == pytest.approx(result.initial_metric - result.final_metric)
    assert [n for n in onnx.load(str(result.path)).graph.node if n.op_type == "QuantizeLinear"]

    def accuracy(path: Path) -> float:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return float(np.mean(session.run(None, {"input": x_test})[0].argmax(1) == data.y_test))

    assert accuracy(fp32) == pytest.approx(result.initial_metric)
    assert accuracy(fp32) - accuracy(result.path) <= 0.01 + 1e-9
    assert not any(p.name.startswith(".nncf.onnx") for p in tmp_path.iterdir())  # no partial file left
