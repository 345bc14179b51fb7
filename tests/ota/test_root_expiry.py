"""An expired root of trust, on a real agent over a real mosquitto (issue 36, part 6): the model keeps running,
new deploys are refused naming the expiry and the fix, the state says so, and the next root lifts it."""

from __future__ import annotations

import shutil

import numpy as np

from edgesdk.agent.managed import ManagedRuntime
from edgesdk.fleet import key_ceremony
from edgesdk.fleet.protocol import Topics
from edgesdk.runtime.bundle import sign_bundle
from edgesdk.runtime.signing import load_private_key
from tests.ota.conftest import publish_retained, rollout_to, wait_for


def test_an_expired_root_keeps_the_model_refuses_new_deploys_and_says_so_until_the_next_root(
        tmp_path, broker, make_server, make_agent, bundles):
    root_path, private = key_ceremony.init_fleet(tmp_path / "fleet", {}, {})
    root_keys = [load_private_key(p) for p in private["root"]]
    bundles_key = load_private_key(private["bundles"][0])
    server = make_server(broker.url, signing_key=load_private_key(private["commands"][0]))
    managed = ManagedRuntime(profile="generic-x86_64")
    agent = make_agent("cam0", broker.url, server_key=None, root=root_path, runtime=managed)
    wait_for(lambda: server.db.device("cam0"), what="device")
    for version in ("1.0.0", "2.0.0"):
        shutil.copytree(bundles[version], tmp_path / version)
        sign_bundle(tmp_path / version, bundles_key)
        server.repo.add(tmp_path / version)
    assert rollout_to(server, "1.0.0").state == "completed"
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)

    # Root v2 is published with a short life, and nobody publishes v3 before it runs out.
    v2 = key_ceremony.rotate(root_path.read_bytes(), "bundles", root_keys, expires_in_s=1.5)
    publish_retained(broker.url, Topics.root(2), v2.document)
    wait_for(lambda: agent.trust.root.version == 2, what="root v2")
    wait_for(lambda: agent.trust.root.expired(), what="root v2 to expire")
    refused = rollout_to(server, "2.0.0")
    (target,) = refused.targets
    assert "root metadata v2 expired at" in (target.reason or "") and "publish" in (target.reason or ""), target
    assert agent.current_version() == ("digits", "1.0.0") and not agent.store.has_slot("digits-2.0.0")
    trust = agent.state()["trust"]
    assert trust["root_expired"] is True and trust["accepts_deploys"] is False and trust["root_version"] == 2
    # The app's model keeps serving.
    assert np.asarray(managed.predict(x)).shape == (1, 10) and managed.bundle.manifest.version == "1.0.0"

    # The next root lifts it: the same release goes ahead.
    v3 = key_ceremony.rotate(v2.document, "bundles", root_keys)
    publish_retained(broker.url, Topics.root(3), v3.document)
    wait_for(lambda: agent.state()["trust"]["accepts_deploys"], what="root v3")
    assert rollout_to(server, "2.0.0").state == "completed" and agent.current_version() == ("digits", "2.0.0")
