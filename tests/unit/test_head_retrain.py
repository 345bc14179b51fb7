"""The OTA delta benchmark's model pair: PP-OCRv4 with a retrained head, backbone untouched (issue 13, figure 1)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.fleet.head_retrain import CHARSET, HEAD_BIAS, HEAD_WEIGHT, head_retrain_pair, render_lines, run_head, train_head
from benchmarks.shared.models import fetch
from edgesdk.errors import DataError


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return head_retrain_pair(tmp_path_factory.mktemp("head_retrain"), quick=True)


def test_versions_differ_only_in_the_head_constants(pair):
    import onnx

    model_a, model_b, _ = pair
    pretrained = onnx.load(str(fetch("ocr_rec"))).graph.node
    for model in (model_a, model_b):
        nodes = onnx.load(str(model)).graph.node
        assert [n.output[0] for n in nodes] == [n.output[0] for n in pretrained]
        changed = [n.output[0] for n, p in zip(nodes, pretrained) if n.SerializeToString() != p.SerializeToString()]
        assert sorted(changed) == sorted([HEAD_WEIGHT, HEAD_BIAS])
    head_a = {n.output[0]: n for n in onnx.load(str(model_a)).graph.node if n.output[0] == HEAD_WEIGHT}
    assert list(head_a[HEAD_WEIGHT].attribute[0].t.dims) == [120, len(CHARSET) + 1]


def test_both_versions_run_and_output_probabilities_over_the_new_charset(pair):
    model_a, model_b, figures = pair
    lines, _ = render_lines(4, seed=99)
    for model in (model_a, model_b):
        output = run_head(model, lines)
        assert output.shape[0] == 4 and output.shape[2] == len(CHARSET) + 1 == figures["classes"]
        np.testing.assert_allclose(output.sum(axis=-1), 1, atol=1e-4)
        assert model.stat().st_size >= 7_000_000


def test_both_versions_read_held_out_lines_and_the_retrain_reads_them_at_least_as_well(pair):
    _, _, figures = pair
    # Chance is about 0 here (an empty or random string scores <= 0); these lines are never trained on.
    assert figures["accuracy_a"] > 0.5
    assert figures["accuracy_b"] >= figures["accuracy_a"]
    assert figures["size_a"] == figures["size_b"]
    head_bytes = (len(CHARSET) + 1) * 121 * 4
    assert 0 < figures["bytes_differing"] <= head_bytes


def test_training_is_deterministic():
    rng = np.random.default_rng(0)
    features = rng.standard_normal((40, 50, 120)).astype(np.float32)
    texts = ["edge 12.50", "RK3588", "hello world"] * 13 + ["v1.2.0"]
    first, second = train_head(features, texts, epochs=2, seed=5), train_head(features, texts, epochs=2, seed=5)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(first, second))


def test_a_string_outside_the_charset_is_refused_with_the_fix():
    features = np.zeros((1, 50, 120), np.float32)
    with pytest.raises(DataError, match=r"\['é'\].*add them to CHARSET"):
        train_head(features, ["café"], epochs=1, seed=0)
