"""Our offload client against a third-party KServe V2 server: the ``kserve`` Python model server.

kserve runs from its own virtualenv (created on the first run, about a minute; see
tests/offload/third_party.py) in a subprocess on a free loopback port, serving the test's ONNX
model through onnxruntime.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk import v2_protocol as v2
from tests.offload.third_party import KServeEnv, KServeServer, http

pytestmark = pytest.mark.kserve


@pytest.fixture(scope="module")
def kserve_env() -> KServeEnv:
    return KServeEnv().ensure()


@pytest.fixture(scope="module")
def kserve_digits(kserve_env, digits_onnx, tmp_path_factory):
    with KServeServer(kserve_env, "digits", digits_onnx, tmp_path_factory.mktemp("kserve")) as server:
        yield server


@pytest.fixture(scope="module")
def sample(digits) -> np.ndarray:
    return np.ascontiguousarray(digits.x_test[:5], dtype=np.float32)


def test_kserve_speaks_v2_its_own_way(kserve_digits, sample):
    """What the client has to cope with: no binary extension advertised, yet binary bodies work; two error forms."""
    status, _, body = http("GET", f"{kserve_digits.url}/v2")
    assert status == 200
    assert v2.BINARY_EXTENSION not in json.loads(body)["extensions"]

    meta = kserve_digits.metadata()
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]

    body, headers = v2.encode_request({"input": sample}, binary_inputs=True, binary_outputs=True)
    status, answer_headers, answer = http("POST", f"{kserve_digits.url}/v2/models/digits/infer", body, headers)
    assert status == 200, answer[:300]
    decoded = v2.decode_response(answer, int(answer_headers[v2.HEADER_LENGTH.lower()]))
    assert decoded.outputs["probabilities"].shape == (5, 10)

    status, _, answer = http("GET", f"{kserve_digits.url}/v2/models/nope")
    assert status == 404 and "nope" in v2.error_message(answer, status)
    status, _, answer = http("POST", f"{kserve_digits.url}/v2/models/digits/infer", b'{"id": "1"}',
                             {"Content-Type": "application/json"})
    assert status == 422 and "detail" in json.loads(answer)
    assert "inputs" in v2.error_message(answer, status)
