"""The endpoint benchmark's h2load driver (endpoint_h2load.py) against a real endpoint.

What it counts: every answered request once, and no failure as an answer: HTTP errors by their
status, gRPC errors (HTTP 200 with the status in trailers, no message) by the missing bytes.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.ota_server.inference import BatchingConfig, ServedModel
from tests.inference.conftest import WIDTH_IN
from tests.inference.http import sample


@pytest.fixture
def h2load():
    from benchmarks.endpoint import endpoint_h2load

    try:
        endpoint_h2load.h2load_path()
    except endpoint_h2load.GeneratorMissing as exc:
        pytest.skip(str(exc))
    return endpoint_h2load


@pytest.fixture
def served(serve):
    batching = BatchingConfig(enabled=False)
    return serve(models=[ServedModel("mlp", batching=batching)], grpc_listen="127.0.0.1:0")


def _request(endpoint, encoding: str, width: int = WIDTH_IN):
    from benchmarks.endpoint.endpoint_load import encode_request

    target = f"grpc://{endpoint.grpc_address}" if encoding == "grpc" else endpoint.url
    x = np.ones((1, width), np.float32)
    return encode_request(target, "mlp", "input", x, "probabilities", encoding)


@pytest.mark.parametrize("encoding", ["json", "binary", "grpc"])
def test_every_answer_is_counted_once_with_the_generators_own_cpu(h2load, served, encoding):
    request = _request(served, encoding)
    answer = h2load.answer_bytes(request)
    result = h2load.closed_loop(request, 2, 0.5, None, None, answer)
    assert result["requests"] > 0 and (result["failed"], result["errors"]) == (0, [])
    # The server saw the probe and every answer; requests cut off by the window's end may add one
    # per connection.
    served_count = sample(served, "edgesdk_inference_requests", "_total") - 1
    assert result["requests"] <= served_count <= result["requests"] + 2
    assert result["latency_ms"]["p50"] <= result["latency_ms"]["p99"] <= result["latency_ms"]["max"]
    assert 0 < result["client_cpu_per_s"] < 1.5


@pytest.mark.parametrize("encoding", ["binary", "grpc"])
def test_refused_requests_count_as_failures_not_answers(h2load, served, encoding):
    good = h2load.answer_bytes(_request(served, encoding))
    wrong = _request(served, encoding, WIDTH_IN + 1)  # the model refuses it: 400, INVALID_ARGUMENT
    result = h2load.closed_loop(wrong, 1, 0.3, None, None, good)
    assert result["requests"] == 0 and result["failed"] > 0 and result["latency_ms"] is None
    assert "lacked a 2xx status or a full answer" in result["errors"][0]


def test_a_missing_generator_says_how_to_install_it(h2load, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(h2load.GeneratorMissing, match="apt-get install nghttp2-client"):
        h2load.h2load_path()
