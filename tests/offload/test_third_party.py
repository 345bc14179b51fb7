"""Our offload client against a third-party KServe V2 server: the ``kserve`` Python model server.

kserve runs from its own virtualenv (created on the first run, about a minute; see
tests/offload/third_party.py) in a subprocess on a free loopback port, serving the test's ONNX
model through onnxruntime.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.shared.peer_venv import PeerVenv
from edgesdk.offload import v2_codec as v2
from tests.offload.third_party import http, kserve_env, kserve_server

pytestmark = pytest.mark.kserve


@pytest.fixture(scope="module")
def kserve_venv() -> PeerVenv:
    venv = kserve_env()
    venv.ensure(timeout_s=900)
    return venv


@pytest.fixture(scope="module")
def kserve_digits(kserve_venv, digits_onnx, tmp_path_factory):
    with kserve_server(kserve_venv, "digits", digits_onnx, tmp_path_factory.mktemp("kserve")) as server:
        yield server


@pytest.fixture(scope="module")
def sample(digits) -> np.ndarray:
    return np.ascontiguousarray(digits.x_test[:5], dtype=np.float32)


def test_kserve_speaks_v2_its_own_way(kserve_digits, sample):
    """What the client has to cope with: no binary extension advertised, yet binary bodies work; two error forms."""
    status, _, body = http("GET", f"{kserve_digits.url}/v2")
    assert status == 200
    assert v2.BINARY_EXTENSION not in json.loads(body)["extensions"]

    status, _, body = http("GET", f"{kserve_digits.url}/v2/models/digits")
    assert status == 200
    meta = json.loads(body)
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


def _policy(server, **settings):
    from edgesdk import OffloadPolicy

    return OffloadPolicy(server.url, server.name, **settings)


@pytest.mark.parametrize("binary", [None, True], ids=["as-advertised", "binary"])
def test_results_from_kserve_equal_local_ones(kserve_digits, digits_onnx, sample, binary):
    """Every request goes to kserve (heavy), as JSON tensors (what it advertises) or forced binary; same results."""
    from edgesdk import Runtime

    with Runtime(digits_onnx, profile="generic-x86_64") as local_rt:
        local = [local_rt.predict(sample[i:i + 2]) for i in range(0, 4, 2)]
    # An objective as long as the other waits here: kserve is measured at construction and must be predicted to meet it.
    policy = _policy(kserve_digits, binary=binary, heavy_input_bytes=1, timeout_ms=10_000, latency_slo_ms=30_000)
    with Runtime(digits_onnx, profile="generic-x86_64", offload=policy) as rt:
        remote = [rt.predict_async(sample[i:i + 2]).result(timeout=60) for i in range(0, 4, 2)]
        stats = rt.stats()
    assert stats.paths["cloud"].count == 2 and stats.paths["cloud"].errors == 0
    assert stats.fallbacks == 0 and stats.paths["local"].count == 0
    for mine, theirs in zip(local, remote):
        assert theirs.dtype == mine.dtype and theirs.shape == mine.shape
        np.testing.assert_allclose(theirs, mine, rtol=1e-5, atol=1e-6)


def test_a_model_kserve_lacks_fails_at_construction(kserve_digits, digits_onnx):
    from edgesdk import OffloadError, OffloadPolicy, Runtime

    with pytest.raises(OffloadError, match="nope") as caught:
        Runtime(digits_onnx, profile="generic-x86_64", offload=OffloadPolicy(kserve_digits.url, "nope"))
    assert caught.value.status == 404 and not caught.value.transient


def test_inputs_that_differ_from_kserve_fail_at_construction(kserve_digits, wide_mlp):
    """The wide MLP takes input float32[?, 256]; kserve's digits model takes [-1, 64]."""
    from edgesdk import OffloadError, Runtime

    with pytest.raises(OffloadError, match=r"input 'input' has shape \[-1, 64\]"):
        Runtime(wide_mlp[1], profile="generic-x86_64", offload=_policy(kserve_digits))


def test_a_request_kserve_refuses_is_a_typed_error(kserve_digits, digits_onnx, sample):
    """kserve will not take FP16 as JSON (400 {"error": ...}) and fails a wrong width in onnxruntime (500)."""
    from edgesdk import OffloadError, Runtime
    from edgesdk.offload import V2Client

    with Runtime(digits_onnx, profile="generic-x86_64") as rt:
        client = V2Client(_policy(kserve_digits))
        try:
            client.configure(rt.inputs, rt.outputs)
            assert client.binary is False  # kserve does not advertise binary_tensor_data
            with pytest.raises(OffloadError, match="FP16 data via JSON is not supported") as caught:
                client.infer({"input": sample.astype(np.float16)})
            assert caught.value.status == 400 and not caught.value.transient
            with pytest.raises(OffloadError, match="Expected: 64") as caught:
                client.infer({"input": sample[:, :10]})
            assert caught.value.status == 500 and caught.value.transient
        finally:
            client.close()


def test_a_version_kserve_cannot_serve_runs_locally(kserve_digits, digits_onnx, sample, caplog):
    """kserve answers 501 to any /versions/{v} path: the runtime starts, says so once and runs every request here."""
    from edgesdk import Runtime

    with Runtime(digits_onnx, profile="generic-x86_64") as local_rt:
        expected = local_rt.predict(sample)
    policy = _policy(kserve_digits, version="1", heavy_input_bytes=1)
    with caplog.at_level("WARNING", logger="edgesdk"), Runtime(digits_onnx, profile="generic-x86_64",
                                                                offload=policy) as rt:
        results = [rt.predict_async(sample).result(timeout=60) for _ in range(3)]
        stats = rt.stats()
    assert [r.tolist() for r in results] == [expected.tolist()] * 3
    assert stats.paths["local"].count == 3 and stats.paths["cloud"].count == 0
    assert stats.breaker == "open"
    warnings = [r for r in caplog.records if "versioning not supported" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
