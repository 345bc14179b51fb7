"""The server hands its devices the offload endpoint in each signed command; the store keeps it per version."""

from __future__ import annotations

from edgesdk.agent.store import offload_endpoint
from edgesdk.fleet.archive import pack_bundle

from .conftest import rollout_to, wait_for


def test_each_committed_version_names_the_endpoint_serving_that_version(broker, make_server, make_agent, bundles):
    server = make_server(broker.url, offload_url="http://127.0.0.1:8000")
    agent = make_agent("cam0", broker.url)
    wait_for(lambda: server.db.device("cam0") and server.db.device("cam0").status == "online", what="agent")
    for version in ("1.0.0", "2.0.0"):
        server.upload(pack_bundle(bundles[version]))
        assert rollout_to(server, version).state == "completed"
    assert offload_endpoint(agent.store.root, "digits-2.0.0") == {"url": "http://127.0.0.1:8000", "model": "digits",
                                                                  "version": "2.0.0"}
    assert offload_endpoint(agent.store.root, "digits-1.0.0")["version"] == "1.0.0"


def test_without_an_endpoint_the_store_names_none(broker, make_server, make_agent, bundles):
    server = make_server(broker.url)
    agent = make_agent("cam0", broker.url)
    wait_for(lambda: server.db.device("cam0") and server.db.device("cam0").status == "online", what="agent")
    server.upload(pack_bundle(bundles["1.0.0"]))
    assert rollout_to(server, "1.0.0").state == "completed"
    assert offload_endpoint(agent.store.root, "digits-1.0.0") is None


def test_an_app_following_the_store_offloads_to_the_servers_endpoint_at_the_committed_version(
        tmp_path, broker, make_server, make_agent, bundles):
    import numpy as np

    from edgesdk import ManagedRuntime
    from edgesdk.ota_server.broker import free_port
    from edgesdk.ota_server.inference import serve_inference

    inference_address = f"127.0.0.1:{free_port()}"
    server = make_server(broker.url, offload_url=f"http://{inference_address}")
    with serve_inference(tmp_path / "repo", inference_address):  # the same repository the OTA server fills
        agent = make_agent("cam0", broker.url)
        wait_for(lambda: server.db.device("cam0") and server.db.device("cam0").status == "online", what="agent")
        server.upload(pack_bundle(bundles["1.0.0"]))
        assert rollout_to(server, "1.0.0").state == "completed"
        app = ManagedRuntime.follow(agent.store.root, profile="generic-x86_64", poll_s=0.1)
        try:
            assert (app.offload.model, app.offload.version) == ("digits", "1.0.0")
            server.upload(pack_bundle(bundles["2.0.0"]))
            assert rollout_to(server, "2.0.0").state == "completed"
            wait_for(lambda: app.bundle.manifest.version == "2.0.0" and app.offload.version == "2.0.0",
                     what="the app and its endpoint on 2.0.0")
            x = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
            cloud = app.predict_async(x, heavy=True).result(timeout=30)  # heavy: the cloud first
            assert app.stats().paths["cloud"].count == 1, app.stats()
            np.testing.assert_allclose(cloud, app.predict(x), rtol=1e-5, atol=1e-6)
        finally:
            app.close()


def test_the_agent_reports_where_its_runtimes_requests_ran(broker, make_server, make_agent, bundles):
    import numpy as np

    from edgesdk import ManagedRuntime

    server = make_server(broker.url)
    managed = ManagedRuntime(profile="generic-x86_64")
    agent = make_agent("cam0", broker.url, runtime=managed)
    wait_for(lambda: server.db.device("cam0") and server.db.device("cam0").status == "online", what="agent")
    server.upload(pack_bundle(bundles["1.0.0"]))
    assert rollout_to(server, "1.0.0").state == "completed"
    x = np.zeros((1, 64), np.float32)
    for future in [managed.predict_async(x) for _ in range(3)]:
        future.result(timeout=30)
    runtime = agent.state()["runtime"]
    assert runtime["paths"]["local"]["count"] == 3 and runtime["refused"] == 0
    managed.close()
