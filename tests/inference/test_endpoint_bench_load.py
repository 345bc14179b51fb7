"""The endpoint benchmark's load driver (benchmarks/endpoint/endpoint_load.py) against a real endpoint: what it counts."""

from __future__ import annotations

import numpy as np
import pytest

from tests.inference.conftest import WIDTH_IN, reference


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
