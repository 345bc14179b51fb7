"""The endpoint as the server runs it: build_server with ServerSetup.inference, and `edgesdk server inference`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton

from edgesdk.ota_server.app import ServerSetup, build_server
from edgesdk.ota_server.broker import LocalMosquitto, free_port, mosquitto_binary
from edgesdk.ota_server.inference import InferenceConfig, ServedModel
from edgesdk.ota_server.server import ServerConfig
from edgesdk.runtime.signing import generate_keypair, load_private_key
from tests.inference.conftest import WIDTH_IN
from tests.inference.http import request


def test_build_server_starts_the_inference_endpoint_over_its_repository(tmp_path, bundles):
    if mosquitto_binary() is None:
        pytest.skip("mosquitto is not installed (scripts/setup.sh installs it)")
    broker = LocalMosquitto(tmp_path / "broker")
    generate_keypair(tmp_path / "keys", "server")
    setup = ServerSetup(ServerConfig(broker.url), repo=tmp_path / "repo", db=tmp_path / "fleet.db",
                        signing_key=load_private_key(tmp_path / "keys" / "server.key"), allow_unsigned=True,
                        inference=f"127.0.0.1:{free_port()}", inference_grpc="127.0.0.1:0",
                        inference_config=InferenceConfig(models=(ServedModel("mlp"),), threads=1))
    try:
        with build_server(setup) as running:
            assert running.url is None and running.inference_url is not None
            # A bundle the OTA side stores is what the endpoint serves.
            running.repository.add(bundles["mlp-1"])
            client = triton.InferenceServerClient(running.inference_url.removeprefix("http://"))
            try:
                tensor = triton.InferInput("input", [2, WIDTH_IN], "FP32")
                tensor.set_data_from_numpy(np.ones((2, WIDTH_IN), np.float32))
                assert client.infer("mlp", [tensor]).as_numpy("probabilities").shape == (2, 4)
            finally:
                client.close()
            grpc_client = triton_grpc.InferenceServerClient(running.inference.grpc_address)
            try:  # and the gRPC service beside it, on the same repository
                tensor = triton_grpc.InferInput("input", [2, WIDTH_IN], "FP32")
                tensor.set_data_from_numpy(np.ones((2, WIDTH_IN), np.float32))
                assert grpc_client.infer("mlp", [tensor]).as_numpy("probabilities").shape == (2, 4)
            finally:
                grpc_client.close()
            url = running.inference_url
        with pytest.raises(OSError):
            request(f"{url}/v2")
    finally:
        broker.stop()


def test_cli_serves_a_repository_until_sigterm(tmp_path, repo):
    config = tmp_path / "inference.yaml"
    config.write_text("models:\n  - {name: mlp, preferred_batch_size: 4, max_queue_delay_us: 200}\n")
    address, grpc_address = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    process = subprocess.Popen([str(Path(sys.executable).with_name("edgesdk")), "server", "inference", "--repo", str(repo.root),
                                "--listen", address, "--inference-config", str(config), "--threads", "1",
                                "--inference-grpc", grpc_address],
                               stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status, _, body = request(f"http://{address}/v2")
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    stderr = process.stderr.read() if process.stderr else ""
                    raise AssertionError(f"the endpoint did not come up: {stderr}") from None
                time.sleep(0.1)
        assert status == 200 and "binary_tensor_data" in json.loads(body)["extensions"]
        assert request(f"http://{address}/v2/models/mlp")[0] == 200
        assert request(f"http://{address}/v2/models/fixed")[0] == 404  # the config lists mlp only
        grpc_client = triton_grpc.InferenceServerClient(grpc_address)
        assert grpc_client.is_model_ready("mlp") and not grpc_client.is_model_ready("fixed")
        grpc_client.close()
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert f"http://{address}/v2" in stderr and f"gRPC {grpc_address}" in stderr


def test_cli_bad_inference_config_is_a_clear_error(tmp_path, repo):
    from click.testing import CliRunner

    from edgesdk.cli import cli

    config = tmp_path / "inference.yaml"
    config.write_text("models:\n  - {name: mlp, preferred_batch_size: 0}\n")
    result = CliRunner().invoke(cli, ["server", "inference", "--repo", str(repo.root), "--listen",
                                      f"127.0.0.1:{free_port()}", "--inference-config", str(config)])
    assert result.exit_code != 0 and "preferred_batch_size is 0" in result.output


def test_importing_the_package_loads_no_web_framework_runtime_metrics_or_grpc_library():
    code = ("import sys, edgesdk.ota_server.inference, edgesdk.ota_server.app, edgesdk.cli.server; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'starlette', 'uvicorn', 'onnxruntime', "
            "'prometheus_client', 'tritonclient', 'grpc', 'google'}))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
