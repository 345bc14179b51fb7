"""The endpoint's deadline, version-load budget and sliced JSON writer, alone (no server, no
network, fake clocks)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from edgesdk.errors import InputError
from edgesdk.offload.v2_codec import decode_response
from edgesdk.ota_server.inference import BatchingConfig, json_encode
from edgesdk.ota_server.inference.batcher import Batcher
from edgesdk.ota_server.inference.deadline import DeadlineExceededError, timeout_us
from edgesdk.ota_server.inference.load_limit import LoadBudget, VersionLoadLimitError


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_request_whose_deadline_passes_in_the_batch_queue_is_dropped_before_it_runs():
    """Before: the batcher ran every queued request, however late its answer would come."""
    clock, runs = FakeClock(), []

    def run(inputs):
        runs.append(inputs["x"].shape[0])
        return {"y": inputs["x"] * 2}

    batcher = Batcher(
        run, BatchingConfig(preferred_batch_size=8, max_queue_delay_us=0), clock=clock
    )
    try:
        with batcher.paused():
            late = batcher.submit({"x": np.ones((1, 2), np.float32)}, deadline=clock.now + 0.010)
            in_time = batcher.submit({"x": np.ones((3, 2), np.float32)}, deadline=clock.now + 10.0)
            clock.now += 0.020  # the first one's 10 ms pass while the batch thread is held
        with pytest.raises(DeadlineExceededError, match="Request timeout expired.*was not run"):
            late.result(timeout=30)
        assert in_time.result(timeout=30)["y"].shape == (3, 2)
        assert runs == [3]  # the late request's row never reached the model
    finally:
        batcher.close()


def test_the_timeout_parameter_is_microseconds_and_zero_means_none():
    assert timeout_us({"timeout": 2500}) == 2500
    assert timeout_us({}) is None and timeout_us({"timeout": 0}) is None
    for bad in (-1, 1.5, "10", True, 2**70, 10**400):  # a huge int overflowed the deadline's float
        with pytest.raises(InputError, match=r"parameters.timeout is .*microseconds"):
            timeout_us({"timeout": bad})


def test_version_loads_are_a_token_bucket_refilled_per_minute():
    clock = FakeClock()
    budget = LoadBudget(2, clock=clock)
    budget.take("v1")
    budget.take("v2")
    with pytest.raises(VersionLoadLimitError) as refused:
        budget.take("v3")
    assert refused.value.retry_after_s == pytest.approx(30.0) and refused.value.retry_after == "30"
    clock.now += 30.0
    budget.take("v3")  # one load came back after half a minute


def _decoded(parts: list[bytes], headers: dict[str, str]):
    length = headers.get("Inference-Header-Content-Length")
    return decode_response(b"".join(parts), None if length is None else int(length))


def test_a_big_json_output_is_written_in_slices_with_the_loop_turning_between_them():
    """Before: one json.dumps of the whole output, in one turn of the loop (no other task ran
    meanwhile)."""
    rng = np.random.default_rng(0)
    outputs = {
        "big": rng.standard_normal((1000, 1000)).astype(np.float32),
        "ids": np.arange(10, dtype=np.int64),
        "raw": np.ones(3, np.float16),
    }

    async def encode_with_probe():
        turns, done = 0, False

        async def probe():
            nonlocal turns
            while not done:
                await asyncio.sleep(0)
                turns += 1

        task = asyncio.ensure_future(probe())
        await asyncio.sleep(0)
        before = turns
        encoded = await json_encode.encode_response_sliced(
            "m", "1", outputs, binary={"raw"}, request_id="r"
        )
        during, done = turns - before, True
        await task
        return encoded, during

    (parts, headers), during = asyncio.run(encode_with_probe())
    slices = -(-outputs["big"].size // json_encode.SLICE_VALUES)
    assert during >= slices - 1  # the probe ran between every two slices
    answer = _decoded(parts, headers)
    assert answer.model_name == "m" and answer.model_version == "1" and answer.id == "r"
    for name, value in outputs.items():
        np.testing.assert_array_equal(answer.outputs[name], value)  # the same numbers, exactly


def test_non_finite_values_are_written_as_the_standard_encoder_writes_them():
    """orjson would write NaN and infinities as null, which reads back as another value (or
    fails)."""
    values = np.array([np.nan, np.inf, -np.inf, 1.5] * 5000, np.float32)
    parts, headers = asyncio.run(json_encode.encode_response_sliced("m", None, {"y": values}))
    assert b"null" not in b"".join(parts)
    np.testing.assert_array_equal(_decoded(parts, headers).outputs["y"], values)  # NaN == NaN here


def test_the_limits_are_read_from_the_inference_config_file(tmp_path):
    from edgesdk.ota_server.inference.config import (
        InferenceConfig,
        inference_config_from_file,
        load_inference_config,
    )

    path = tmp_path / "inference.yaml"
    path.write_text(
        "models: [{name: digits}]\n"
        "limits: {max_concurrent_requests: 8, version_loads_per_minute: 2}\n"
    )
    config = inference_config_from_file(path, threads=1)
    assert (config.max_concurrent_requests, config.version_loads_per_minute, config.threads) == (
        8,
        2,
        1,
    )
    assert (
        config.max_body_bytes == InferenceConfig().max_body_bytes
        and config.models[0].name == "digits"
    )
    with pytest.raises(InputError, match="one key 'models'"):
        load_inference_config(path)  # would drop the limits silently
    path.write_text("models: []\nlimits: {max_body_bytes: 0}\n")
    with pytest.raises(InputError, match="inference.yaml: InferenceConfig.max_body_bytes is 0"):
        inference_config_from_file(path)
