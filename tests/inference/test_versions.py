"""Which version runs: the newest (re-resolved per request), a pinned one, an explicit one; the session cache."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import BundleError, InputError
from edgesdk.offload.v2_codec import HEADER_LENGTH, decode_response, encode_request
from edgesdk.ota_server.inference import BatchingConfig, InferenceConfig, ServedModel, load_inference_config
from tests.inference.conftest import WIDTH_IN, reference
from tests.inference.http import request

X = np.random.default_rng(3).standard_normal((2, WIDTH_IN)).astype(np.float32)


def run(endpoint, version: str | None = None, model: str = "mlp"):
    body, headers = encode_request({"input": X}, binary_inputs=True, binary_outputs=True)
    url = f"{endpoint.url}/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    status, answer_headers, answer = request(url, body, headers)
    assert status == 200, answer
    return decode_response(answer, int(answer_headers[HEADER_LENGTH]))


def test_newly_pushed_version_is_served_without_restart(endpoint, repo, bundles):
    first = run(endpoint)
    assert first.model_version == "1.0.0"
    repo.add(bundles["mlp-2"])
    second = run(endpoint)
    assert second.model_version == "2.0.0"
    np.testing.assert_allclose(second.outputs["probabilities"], reference(bundles["mlp-2"], X), rtol=1e-5, atol=1e-6)
    assert run(endpoint, "1.0.0").model_version == "1.0.0"


def test_pinned_version_is_served_until_asked_otherwise(serve, repo, bundles):
    repo.add(bundles["mlp-2"])
    endpoint = serve(models=[ServedModel("mlp", version="1.0.0")])
    response = run(endpoint)
    assert response.model_version == "1.0.0"
    np.testing.assert_allclose(response.outputs["probabilities"], reference(bundles["mlp-1"], X), rtol=1e-5, atol=1e-6)
    assert run(endpoint, "2.0.0").model_version == "2.0.0"
    # Only listed models are served.
    status, _, body = request(f"{endpoint.url}/v2/models/fixed")
    assert status == 404 and b"not served" in body


def test_session_cache_keeps_at_most_max_sessions(serve, repo, bundles):
    repo.add(bundles["mlp-2"])
    endpoint = serve(config=InferenceConfig(max_sessions=1))
    first = endpoint.registry.get("mlp", "1.0.0")
    run(endpoint, "2.0.0")
    assert endpoint.registry.cached("mlp", "1.0.0") is None and first.batcher.closed
    # An evicted model is loaded again on demand.
    assert run(endpoint, "1.0.0").model_version == "1.0.0"


def test_config_validation_names_the_value():
    with pytest.raises(InputError, match=r"preferred_batch_size is 0"):
        BatchingConfig(preferred_batch_size=0)
    with pytest.raises(InputError, match=r"max_queue_delay_us is -1"):
        BatchingConfig(max_queue_delay_us=-1)
    with pytest.raises(BundleError, match=r"version 'latest'"):
        ServedModel("mlp", version="latest")
    with pytest.raises(InputError, match=r"\['mlp'\] more than once"):
        InferenceConfig(models=(ServedModel("mlp"), ServedModel("mlp")))
    with pytest.raises(InputError, match="threads is 0"):
        InferenceConfig(threads=0)


def test_inference_config_yaml(tmp_path):
    path = tmp_path / "inference.yaml"
    path.write_text("models:\n  - name: mlp\n    version: 1.0.0\n    preferred_batch_size: 4\n"
                    "    max_queue_delay_us: 100\n  - {name: fixed, batching: false, max_queue: 3}\n")
    assert load_inference_config(path) == (
        ServedModel("mlp", "1.0.0", BatchingConfig(preferred_batch_size=4, max_queue_delay_us=100)),
        ServedModel("fixed", None, BatchingConfig(max_queue=3, enabled=False)))
    for text, words in [("models: {name: mlp}", "one key 'models' holding a list"),
                        ("models:\n  - name: mlp\n    max_batch: 4\n", "unknown keys ['max_batch']"),
                        ("models:\n  - name: mlp\n    max_queue: 0\n", "models[1]: BatchingConfig.max_queue is 0"),
                        ("models: [", "not valid YAML")]:
        path.write_text(text)
        with pytest.raises(InputError, match=None) as caught:
            load_inference_config(path)
        assert words in str(caught.value) and str(path) in str(caught.value)
    with pytest.raises(InputError, match="cannot read"):
        load_inference_config(tmp_path / "missing.yaml")
