"""The embedded broker starts whatever the calling thread's asyncio state (a suite-order failure)."""

from __future__ import annotations

import asyncio

from edgesdk.ota_server.broker import EmbeddedBroker


def test_the_embedded_broker_starts_after_an_asyncio_run_on_the_same_thread():
    """asyncio.run() leaves its thread with no current loop; amqtt asks for the current one while
    it is built, so the broker failed with "There is no current event loop" when a test (or an
    app) had used asyncio.run() on the thread before."""

    async def nothing() -> int:
        return 1

    assert asyncio.run(nothing()) == 1
    broker = EmbeddedBroker()
    try:
        assert broker.port > 0
    finally:
        broker.stop()
