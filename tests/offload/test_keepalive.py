"""Pooled connections the server closed while idle (uvicorn does after 5 s) cost no failed request."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from edgesdk import OffloadPolicy
from edgesdk.offload.client import V2Client
from edgesdk.ota_server.broker import free_port

pytest.importorskip("starlette", reason="our endpoint needs the [server] extra")

UVICORN_KEEP_ALIVE_S = 5  # uvicorn's default timeout_keep_alive, which our endpoint keeps


def test_a_pool_of_connections_the_server_closed_while_idle_is_replaced_without_an_error(two, tmp_path):
    from edgesdk.ota_server.inference import serve_inference
    from edgesdk.ota_server.repository import ModelRepository

    repository = ModelRepository(tmp_path / "repo", allow_unsigned=True)
    repository.add(two[0][0])
    with serve_inference(repository, f"127.0.0.1:{free_port()}", threads=1) as endpoint:
        client = V2Client(OffloadPolicy(endpoint.url, "mlp", max_cloud_inflight=4))
        try:
            x = np.zeros((1, 64), np.float32)
            calls = [threading.Thread(target=client.infer, args=({"input": x},)) for _ in range(4)]
            for call in calls:
                call.start()
            for call in calls:
                call.join(30)
            assert client.idle_connections() >= 2, "the test needs several pooled connections"
            time.sleep(UVICORN_KEEP_ALIVE_S + 1.5)  # the server closes every idle keep-alive connection
            for _ in range(3):
                client.infer({"input": x})  # raised OffloadError (BrokenPipe) before idle connections were dropped
        finally:
            client.close()
