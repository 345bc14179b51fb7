"""The endpoint benchmark's load driver (benchmarks/endpoint/endpoint_load.py) against a real endpoint: what it counts."""

from __future__ import annotations

import os

import numpy as np
import pytest

from edgesdk.ota_server.inference import BatchingConfig, ServedModel
from tests.inference.conftest import WIDTH_IN, reference
from tests.inference.http import sample


@pytest.mark.parametrize("encoding", ["binary", "json", "grpc"])
def test_the_pre_encoded_request_gets_the_models_answer(serve, bundles, encoding):
    from benchmarks.endpoint.endpoint_load import connect, encode_request

    endpoint = serve(grpc_listen="127.0.0.1:0")
    target = f"grpc://{endpoint.grpc_address}" if encoding == "grpc" else endpoint.url
    x = np.random.default_rng(3).standard_normal((2, WIDTH_IN)).astype(np.float32)
    request = encode_request(target, "mlp", "input", x, "probabilities", encoding)
    assert ("Inference-Header-Content-Length" in request.headers) == (encoding == "binary")
    connection = connect(request)
    np.testing.assert_allclose(connection.call(), reference(bundles["mlp-1"], x), rtol=1e-5, atol=1e-6)
    connection.close()


def test_closed_loop_counts_every_answered_request_and_each_failure(serve):
    from benchmarks.endpoint.endpoint_load import closed_loop, encode_request

    endpoint = serve(models=[ServedModel("mlp", batching=BatchingConfig(enabled=False))])
    x = np.ones((1, WIDTH_IN), np.float32)
    cpu = sorted(os.sched_getaffinity(0))[-1]
    good = closed_loop(encode_request(endpoint.url, "mlp", "input", x, "probabilities", "binary"), 2, 1.0, 60, cpu)
    # Bounded by max_requests: 30 per client, every one answered and counted by the server too.
    assert (good["requests"], good["failed"], good["errors"]) == (60, 0, [])
    assert sample(endpoint, "edgesdk_inference_requests", "_total") == 60 + 2  # and one warm-up per client
    assert good["latency_ms"]["p50"] <= good["latency_ms"]["p99"] <= good["latency_ms"]["max"]
    assert good["throughput_rps"] == pytest.approx(60 / good["seconds"])
    wrong = encode_request(endpoint.url, "mlp", "input", np.ones((1, WIDTH_IN + 1), np.float32), "probabilities",
                           "binary")
    bad = closed_loop(wrong, 1, 0.3, 5, cpu)
    assert (bad["requests"], bad["failed"]) == (0, 5) and any("HTTP 400" in e for e in bad["errors"])
