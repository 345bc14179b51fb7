"""Closed-loop KServe V2 load from h2load, a load generator in C, for the endpoint benchmark.

Why not Python clients: 8 client processes on one core (tritonclient encoding and decoding
every call) saturated that core at about 5,300 requests/s, under what our endpoint serves on the
16-8-4 MLP, so the JSON and HTTP-binary comparisons measured the clients and counted nothing.
h2load (nghttp2's, Debian package ``nghttp2-client``) is an event loop in C: one thread, one
core, ``clients`` keep-alive connections each with one request in flight (``-m 1``), so the
load is closed-loop like the Python clients', at a small fraction of their CPU per request.

One generator for the three encodings: HTTP/1.1 (``--h1``) for JSON and binary tensors, and
HTTP/2 for gRPC, where the body is the serialized ``ModelInferRequest`` in gRPC's framing (a zero
compression flag, a 4-byte big-endian length) with ``content-type: application/grpc``.

What is measured, per run: answers per second over the window, latency percentiles from
h2load's per-request log (``--log-file``: start, status, microseconds to the end of the
response), the generator's own CPU per second (``wait4``'s rusage of the h2load process: near
1.0 would mean it set the pace, so such a run counts toward no goal), and the server's CPU per
second and per answer (its process tree, before and after).

A request counts as answered only if it was answered in full: HTTP status 2xx and as many
body bytes as the one probe answer (:func:`answer_bytes`) that a real client (tritonclient)
decoded and checked before the runs. gRPC reports failures in trailers under HTTP 200, with no
message, so a gRPC failure shows as an answer without the answer's bytes; the body bytes of a
run divided by the probe answer's size is the count of full answers, and the rest are failures.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.endpoint.endpoint_load import Request, percentiles, tree_cpu_s

__all__ = ["GENERATOR", "GeneratorMissing", "h2load_path", "h2load_command", "answer_bytes",
           "closed_loop"]

#: The load generator's executable, from Debian's ``nghttp2-client`` (scripts/setup.sh installs it).
GENERATOR = "h2load"
#: The path of the V2 gRPC inference call.
_GRPC_PATH = "/inference.GRPCInferenceService/ModelInfer"
_SUMMARY = re.compile(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) "
                      r"failed, (\d+) errored, (\d+) timeout")
_TRAFFIC = re.compile(r"traffic: .*?\((\d+)\) total, .*?\((\d+)\) headers .*?\((\d+)\) data")
_STATUSES = re.compile(r"status codes: (\d+) 2xx")


class GeneratorMissing(RuntimeError):
    """h2load is not installed: the message says how to install it."""


def h2load_path() -> str:
    """The h2load executable; GeneratorMissing saying how to install it when it is not on PATH."""
    found = shutil.which(GENERATOR)
    if found is None:
        raise GeneratorMissing(
            f"{GENERATOR} is not installed (not on PATH={os.environ.get('PATH', '')}); the "
            "endpoint comparison needs a load generator that does not saturate before the "
            "servers: run scripts/setup.sh as root, or apt-get install nghttp2-client")
    return found


def _body(request: Request) -> bytes:
    if request.target.startswith("grpc://"):
        return b"\0" + len(request.body).to_bytes(4, "big") + request.body
    return request.body


def h2load_command(request: Request, clients: int, body_file: Path, log_file: Path | None,
                   seconds: float | None) -> list[str]:
    """h2load's command line: ``clients`` connections for ``seconds`` (None: one request)."""
    if request.target.startswith("grpc://"):
        url = f"http://{request.target.removeprefix('grpc://')}{_GRPC_PATH}"
        headers = {"content-type": "application/grpc", "te": "trailers"}
        protocol: list[str] = []
    else:
        url = f"{request.target}/v2/models/{request.model}/infer"
        headers, protocol = request.headers, ["--h1"]
    load = ["-n", "1", "-c", "1"] if seconds is None else \
        ["-c", str(clients), "-D", f"{round(seconds * 1000)}ms"]
    logged = ["--log-file", str(log_file)] if log_file is not None else []
    header_args = [arg for name, value in headers.items() for arg in ("-H", f"{name}: {value}")]
    return [h2load_path(), *protocol, *load, "-m", "1", "-t", "1", "-d", str(body_file), *logged,
            *header_args, url]


def _run(command: list[str], cpu: int | None) -> tuple[str, float, float]:
    """h2load pinned to ``cpu``: its output, its CPU seconds (user + system), its wall seconds."""
    started = time.monotonic()
    pin = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, preexec_fn=pin)
    assert process.stdout is not None
    with process.stdout:
        output = process.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(process.pid, 0)  # its own rusage: what the generator spent
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{GENERATOR} exited {process.returncode}: {output[-2000:]}")
    return output, usage.ru_utime + usage.ru_stime, time.monotonic() - started


def _counts(output: str) -> dict[str, int]:
    """h2load's request, status and traffic counts from its summary."""
    found, traffic, statuses = (p.search(output) for p in (_SUMMARY, _TRAFFIC, _STATUSES))
    if not found or not traffic or not statuses:
        raise RuntimeError(f"{GENERATOR}'s summary was not understood: {output[-1500:]}")
    return {"done": int(found.group(2)), "succeeded": int(found.group(3)),
            "failed": int(found.group(4)) + int(found.group(5)) + int(found.group(6)),
            "ok_status": int(statuses.group(1)), "data_bytes": int(traffic.group(3))}


def answer_bytes(request: Request) -> int:
    """Body bytes of one answer to ``request`` (after a real client checked one answer)."""
    with tempfile.TemporaryDirectory(prefix="edgesdk-h2load-") as work:
        body = Path(work) / "body"
        body.write_bytes(_body(request))
        counts = _counts(_run(h2load_command(request, 1, body, None, None), None)[0])
    if counts["ok_status"] != 1 or counts["data_bytes"] == 0:
        raise RuntimeError(f"the probe request to {request.target} was not answered: {counts}")
    return counts["data_bytes"]


def closed_loop(request: Request, clients: int, seconds: float, cpu: int | None,
                server_pid: int | None, answer: int) -> dict[str, Any]:
    """h2load pinned to ``cpu``: ``clients`` connections send ``request`` back to back for
    ``seconds``.

    ``answer`` is :func:`answer_bytes` of ``request``. The figures have the keys of
    :func:`endpoint_load.closed_loop`'s, ``client_cpu_per_s`` being the generator's own CPU.
    """
    with tempfile.TemporaryDirectory(prefix="edgesdk-h2load-") as work:
        body, log_file = Path(work) / "body", Path(work) / "requests.tsv"
        body.write_bytes(_body(request))
        command = h2load_command(request, clients, body, log_file, seconds)
        server_before = tree_cpu_s(server_pid) if server_pid else 0.0
        output, generator_cpu, wall = _run(command, cpu)
        server_cpu = (tree_cpu_s(server_pid) - server_before) if server_pid else None
        rows = [line.split("\t") for line in log_file.read_text().splitlines()
                if line.count("\t") == 2]
    counts = _counts(output)
    # See the module docstring. Under load h2load's status tally can hold one answer more than
    # its "done" count (a request finishing as the duration ends): an answer is counted once.
    full = min(counts["ok_status"], counts["data_bytes"] // answer, counts["done"])
    # Which 2xx rows lacked their body is unknown: the slowest are kept (an error answers fast).
    latencies = sorted(int(row[2]) / 1e6 for row in rows if row[1].startswith("2"))
    latencies = latencies[len(latencies) - full:] if full else []
    short = counts["done"] - full
    return {"clients": clients, "requests": full, "failed": short + counts["failed"],
            "seconds": seconds, "throughput_rps": full / seconds,
            "latency_ms": percentiles(latencies) if latencies else None,
            "client_cpu_per_s": round(generator_cpu / wall, 3),
            "server_cpu_per_s": None if server_cpu is None else round(server_cpu / wall, 3),
            "server_cpu_ms_per_request": None if server_cpu is None or not full
            else 1e3 * server_cpu * (seconds / wall) / full,
            "generator": GENERATOR, "answer_bytes": answer,
            "errors": [] if not short and not counts["failed"] else
            [f"{short} of {counts['done']} answers lacked a 2xx status or a full answer's {answer} "
             f"bytes; {counts['failed']} failed in {GENERATOR}"]}
