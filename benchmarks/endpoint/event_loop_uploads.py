"""500 concurrent slow uploads against the endpoint, for benchmarks/endpoint/event_loop.py.

Each connection announces a 1 MiB JSON body and trickles 1 KiB every 100 ms from one thread
(non-blocking sockets); an upload the server answers (503 from a transport limit) or closes
counts as refused. The server's RSS (``/proc/PID/status`` VmRSS) is sampled every 50 ms against
the bound its limits state: ``min(max_buffered_bytes, max_concurrent_requests x 1 MiB)`` of
bodies plus :data:`CONNECTION_BYTES` per connection (socket and protocol buffers); health is
polled throughout.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.endpoint.event_loop_health import LoopCpu, health_while, percentiles
from benchmarks.endpoint.offload_load import Cloud
from edgesdk.ota_server.inference import InferenceConfig

__all__ = [
    "UPLOADS",
    "UPLOAD_BYTES",
    "TRICKLE_BYTES",
    "TRICKLE_S",
    "CONNECTION_BYTES",
    "run_slow_uploads",
]

UPLOADS, UPLOAD_BYTES, TRICKLE_BYTES, TRICKLE_S = 500, 1024 * 1024, 1024, 0.1
#: Per connection in the stated RSS bound: socket and protocol buffers.
CONNECTION_BYTES = 64 * 1024


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _open_upload(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        f"POST /v2/models/total/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
        f"\r\nContent-Length: {UPLOAD_BYTES}\r\n\r\n".encode()
        + b" " * TRICKLE_BYTES
    )
    sock.setblocking(False)
    return sock


def _trickle(
    socks: dict[int, socket.socket],
    refused: set[int],
    seconds: float,
    stop: threading.Event,
    rss: list[int],
    pid: int,
) -> None:
    """Send TRICKLE_BYTES on every open upload each TRICKLE_S; an upload answered or closed is
    refused."""
    chunk, ends = b" " * TRICKLE_BYTES, time.monotonic() + seconds
    next_send = 0.0
    while time.monotonic() < ends:
        rss.append(_rss(pid))
        if time.monotonic() >= next_send:
            next_send = time.monotonic() + TRICKLE_S
            for number, sock in socks.items():
                if number in refused:
                    continue
                try:
                    if sock.recv(4096, socket.MSG_PEEK):
                        refused.add(number)  # the server answered (503) before the body was read
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    refused.add(number)
                    continue
                try:
                    sock.send(chunk)
                except BlockingIOError:
                    pass
                except OSError:
                    refused.add(number)
        time.sleep(0.05)
    stop.set()


def run_slow_uploads(server: Cloud, seconds: float) -> dict[str, Any]:
    """RSS growth and health while UPLOADS connections trickle their bodies for ``seconds``."""
    assert server.process is not None
    pid, defaults = server.process.pid, InferenceConfig()
    loop = LoopCpu(pid, server.port)
    before = _rss(pid)
    socks = {number: _open_upload(server.port) for number in range(UPLOADS)}
    refused: set[int] = set()
    rss: list[int] = []
    stop = threading.Event()
    trickler = threading.Thread(target=_trickle, args=(socks, refused, seconds, stop, rss, pid))
    trickler.start()
    loop_cpu: list[float] = []
    health = health_while(server.port, stop, loop, loop_cpu)
    trickler.join()
    for sock in socks.values():
        sock.close()
    bodies = min(defaults.max_buffered_bytes, defaults.max_concurrent_requests * UPLOAD_BYTES)
    bound = bodies + UPLOADS * CONNECTION_BYTES
    return {
        "uploads": UPLOADS,
        "declared_bytes_each": UPLOAD_BYTES,
        "seconds": seconds,
        "refused_503": len(refused),
        "held": UPLOADS - len(refused),
        "rss_before_mib": before / 2**20,
        "rss_max_mib": max(rss) / 2**20,
        "rss_growth_mib": (max(rss) - before) / 2**20,
        "stated_bound_mib": bound / 2**20,
        "bound": f"min(max_buffered_bytes {defaults.max_buffered_bytes}, max_concurrent_requests "
        f"{defaults.max_concurrent_requests} x {UPLOAD_BYTES}) + {UPLOADS} x {CONNECTION_BYTES}",
        "health_ms": percentiles(health),
        "loop_cpu_per_health_ms": percentiles(loop_cpu),
    }
