"""Starting an MQTT broker on loopback for the demo, the tests and the benchmarks.

:class:`LocalMosquitto` runs the ``mosquitto`` binary (Debian package ``mosquitto``) with a
generated config on a free 127.0.0.1 port. Where no mosquitto binary exists,
:class:`EmbeddedBroker` runs amqtt in-process, bound to 127.0.0.1 only (amqtt's own
default listens on 0.0.0.0).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from edgesdk.errors import TransferError

__all__ = ["free_port", "mosquitto_binary", "LocalMosquitto", "EmbeddedBroker", "embedded_broker_for",
           "start_local_broker"]

_LOOPBACK = ("127.0.0.1", "localhost")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (another process may still take it before you bind)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mosquitto_binary() -> str | None:
    """Path of the mosquitto executable (on PATH, else /usr/sbin/mosquitto), or None when it is not installed."""
    found = shutil.which("mosquitto")
    if found:
        return found
    return "/usr/sbin/mosquitto" if os.path.exists("/usr/sbin/mosquitto") else None


def _wait_listening(port: int, alive: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll until 127.0.0.1:port accepts connections; ``alive()`` False means the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if not alive():
                raise TransferError("the broker exited during start-up") from None
            time.sleep(0.05)
    raise TransferError(f"the broker did not listen on 127.0.0.1:{port} within {timeout:g} s")


def _with_open_files(limit: int, argv: list[str]) -> list[str]:
    """``argv`` run through ``sh`` with RLIMIT_NOFILE raised to ``limit`` (or to the hard limit when not privileged).

    A shell does it rather than a ``preexec_fn``: a ``preexec_fn`` makes Python fork() instead of vfork(), which
    runs every library's fork handlers in the child. gRPC's, in a process that serves or calls gRPC, sometimes
    killed the child before it reached exec (CI saw "the broker exited during start-up" with gRPC's epoll error
    as the log's only line).
    """
    script = 'ulimit -n "$1" 2>/dev/null || ulimit -n "$(ulimit -H -n)"; shift; exec "$@"'
    return ["sh", "-c", script, "sh", str(limit), *argv]


class LocalMosquitto:
    """A mosquitto process on 127.0.0.1; ``restart()`` keeps the port.

    ``max_open_files`` (e.g. 12000 for 10,000 clients) starts mosquitto with that RLIMIT_NOFILE,
    no connection cap and no cap on a client's queue (by default mosquitto drops a slow client's
    QoS 1 messages past 1000 queued: a server hearing 10,000 devices at once loses reports); without
    it mosquitto inherits this process's descriptor limit (often 1024) and its default caps.
    """

    def __init__(self, workdir: str | os.PathLike[str], conf_lines: list[str] | None = None,
                 port: int | None = None, max_open_files: int | None = None) -> None:
        binary = mosquitto_binary()
        if binary is None:
            raise TransferError("mosquitto is not installed: `apt-get install -y mosquitto` (scripts/setup.sh does "
                                "it as root), or use the embedded broker")
        self.binary, self.port = binary, port or free_port()
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        self.conf, self.log = workdir / "mosquitto.conf", workdir / "mosquitto.log"
        lines = conf_lines or [f"listener {self.port} 127.0.0.1", "allow_anonymous true", "persistence false"]
        self.max_open_files = max_open_files
        if max_open_files is not None:
            # A fleet's burst (every device's state or event at once) must not overflow the server's queue:
            # mosquitto drops QoS 1 messages past max_queued_messages (default 1000) per client.
            lines = [*lines, *(line for line in ("max_connections -1", "max_queued_messages 0") if line not in lines)]
        if os.geteuid() == 0 and not any(line.startswith("user ") for line in lines):
            lines = [*lines, "user root"]  # as root mosquitto drops to user "mosquitto", who cannot read our files
        self.conf.write_text("\n".join(lines) + "\n")
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        """The broker's address for clients: ``mqtt://127.0.0.1:PORT``."""
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start mosquitto and wait until it listens; TransferError (with the log's tail) if it exits or stays deaf."""
        with open(self.log, "ab") as log:
            argv = [self.binary, "-c", str(self.conf)]
            if self.max_open_files:
                argv = _with_open_files(self.max_open_files, argv)
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        process = self.process
        try:
            _wait_listening(self.port, lambda: process.poll() is None)
        except TransferError as exc:
            raise TransferError(f"{exc}: {self.log.read_text()[-400:]}") from None

    def stop(self) -> None:
        """Terminate mosquitto and wait for it to exit; nothing happens when it is not running."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def restart(self, down_s: float = 0.5) -> None:
        """Stop, stay down ``down_s`` seconds, and start again on the same port (clients see a broker outage)."""
        self.stop()
        time.sleep(down_s)
        self.start()


class EmbeddedBroker:
    """amqtt in a background thread, listening on 127.0.0.1 only (needs the ``[server]`` extra)."""

    def __init__(self, port: int | None = None) -> None:
        import logging
        import warnings

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # amqtt's own notice about its psutil extra
                from amqtt.broker import Broker
        except ImportError as exc:
            raise TransferError("the embedded broker needs amqtt: pip install 'edgesdk[server]'") from exc
        logging.getLogger("amqtt").setLevel(logging.CRITICAL)  # it logs every probe and shutdown at ERROR
        self.port = port or free_port()
        config = {"listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{self.port}"}},
                  "auth": {"allow-anonymous": True}, "topic-check": {"enabled": False}}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="embedded-broker", daemon=True)
        self._thread.start()

        async def build() -> Broker:
            # Built on its own loop: amqtt binds futures to the *current* loop while it is built,
            # which on the caller's thread is another loop, or none after an asyncio.run() there.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                return Broker(config, loop=self._loop)

        try:
            self._broker = asyncio.run_coroutine_threadsafe(build(), self._loop).result(timeout=10)
        except BaseException:
            self._stop_loop()
            raise
        # start() returns once the listener is bound (no TCP probe: amqtt leaks a socket on a bare connect).
        try:
            asyncio.run_coroutine_threadsafe(self._broker.start(), self._loop).result(timeout=10)
        except Exception as exc:  # amqtt wraps the OSError of a taken port in its own BrokerError
            self._stop_loop()
            raise TransferError(f"the embedded broker cannot listen on 127.0.0.1:{self.port} ({exc}); choose a free "
                                "port in --broker, or stop what listens there") from exc

    @property
    def url(self) -> str:
        """The broker's address for clients: ``mqtt://127.0.0.1:PORT``."""
        return f"mqtt://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Shut amqtt down and end its thread and event loop; call it once."""
        asyncio.run_coroutine_threadsafe(self._broker.shutdown(), self._loop).result(timeout=10)
        self._stop_loop()

    def _stop_loop(self) -> None:
        asyncio.run_coroutine_threadsafe(_cancel_tasks(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


async def _cancel_tasks() -> None:
    """Cancel what amqtt left running (a failed start leaves its broadcast task), so the loop closes cleanly."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def embedded_broker_for(url: str | None) -> EmbeddedBroker:
    """An embedded broker on the port of ``url`` (``mqtt://127.0.0.1:PORT``), or a free port when None.

    It has no authentication or TLS, so only a loopback ``mqtt://`` address is accepted.
    """
    if url is None:
        return EmbeddedBroker()
    from edgesdk.fleet.transport import parse_broker_url

    address = parse_broker_url(url)
    if address.tls or address.host not in _LOOPBACK:
        raise TransferError(f"the embedded broker has no TLS or passwords, so it listens on loopback only; give "
                            f"--broker mqtt://127.0.0.1:PORT (not {url!r}), or run mosquitto for other addresses")
    return EmbeddedBroker(address.port)


def start_local_broker(workdir: str | os.PathLike[str]) -> LocalMosquitto | EmbeddedBroker:
    """mosquitto when installed, else the embedded amqtt broker; both on loopback only."""
    if mosquitto_binary() is not None:
        return LocalMosquitto(workdir)
    return EmbeddedBroker()
