"""An idle server (no rollout to drive, no revert to finish) ticks once a release pass, not every ``tick_s``."""

from __future__ import annotations

import time


def test_an_idle_server_ticks_once_a_release_pass(broker, start_server):
    server = start_server(broker.url, tick_s=0.05, reconcile_s=0.5).ota
    ticks = []
    tick = server.engine.tick
    server.engine.tick = lambda: (ticks.append(time.monotonic()), tick())[1]  # type: ignore[method-assign]
    time.sleep(2.0)
    # Every tick_s that would be ~40 ticks; once a pass, ~4. A slow machine only makes fewer.
    assert 1 <= len(ticks) <= 6, f"{len(ticks)} ticks in 2 s while idle"
