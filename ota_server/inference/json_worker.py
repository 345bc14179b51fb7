"""JSON request bodies over ``json_worker_bytes`` are decoded in a worker process, not in this one.

Parsing a 32 MiB JSON body of numbers takes about 0.25 s of CPU in C (pysimdjson or orjson), which
holds the GIL throughout: in a thread it stalls the event loop as surely as on it (health waited for
the whole parse). A JSON text is one value, so its parse cannot be sliced the way a response is
written (:mod:`.json_encode`); it goes to another process instead: one worker, started at the first
such body, niced below the loop (:data:`WORKER_NICENESS`: on a shared core the loop goes first), fed
one body at a time in arrival order (more workers would share the same cores and stretch every
parse). The body goes over a pipe (the writes release the GIL) and each decoded tensor comes back as
raw bytes read straight into its array, so this process holds the GIL only for copies of pipe-sized
pieces. The worker decodes with :func:`~edgesdk.offload.v2_codec.decode_request`, the same function
as every other path, so answers and error messages are the same.

Binary tensors (the binary data extension) need no parse at all: send large tensors that way.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from edgesdk.errors import EdgeSDKError, InputError
from edgesdk.offload.v2_codec import InferRequest

__all__ = ["JsonDecodeWorker", "WORKER_NICENESS", "DecodeWorkerError"]

#: How much lower than the event loop the worker process runs (nice levels).
WORKER_NICENESS = 10


class DecodeWorkerError(EdgeSDKError):
    """The decode worker process ended while decoding a body (killed, out of memory); answered with
    503."""


def _serve(conn: Any, niceness: int) -> None:
    """The worker process: decode bodies until the pipe closes."""
    try:
        os.nice(niceness)
    except OSError:
        pass
    from edgesdk.offload.v2_codec import decode_request

    while True:
        try:
            (header_length,) = conn.recv()
            body = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            request = decode_request(body, header_length)
        except InputError as exc:
            conn.send(("input", str(exc)))
            continue
        except Exception as exc:  # reported to the parent, which logs it as a 500
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
            continue
        arrays = [
            a if a.flags.c_contiguous else a.copy() for a in request.inputs.values()
        ]  # 0-d stays 0-d
        specs = [(name, a.dtype.str, a.shape) for name, a in zip(request.inputs, arrays)]
        conn.send(
            ("ok", request.id, request.outputs, request.binary_outputs, request.parameters, specs)
        )
        for array in arrays:
            conn.send_bytes(array.reshape(-1).view(np.uint8))


class JsonDecodeWorker:
    """The worker process and the one thread that talks to it; :meth:`decode` is awaited on the
    loop."""

    def __init__(self, niceness: int = WORKER_NICENESS) -> None:
        self.niceness = niceness
        self._lock = threading.Lock()
        self._conn: Any = None
        self._process: Any = None
        self._talker = ThreadPoolExecutor(1, thread_name_prefix="v2-json-worker")
        #: Bodies decoded by the worker process (for tests and metrics).
        self.decoded = 0

    @property
    def pid(self) -> int | None:
        """The worker process's id, or None before the first body (or after it ended)."""
        return self._process.pid if self._process is not None else None

    async def decode(self, body: bytes | memoryview, header_length: int | None) -> InferRequest:
        """The decoded request, as :func:`~edgesdk.offload.v2_codec.decode_request` gives it."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._talker, self.decode_blocking, body, header_length)

    def decode_blocking(self, body: bytes | memoryview, header_length: int | None) -> InferRequest:
        """:meth:`decode` from a thread that may wait."""
        with self._lock:
            conn = self._connection()
            try:
                conn.send((header_length,))
                conn.send_bytes(body)
                reply = conn.recv()
                if reply[0] == "input":
                    raise InputError(reply[1])
                if reply[0] == "error":
                    raise RuntimeError(
                        f"decoding the body failed in the worker process: {reply[1]}"
                    )
                _, request_id, outputs, binary_outputs, parameters, specs = reply
                inputs = {}
                for name, dtype, shape in specs:
                    array = np.empty(shape, np.dtype(dtype))
                    conn.recv_bytes_into(array.reshape(-1).view(np.uint8))
                    inputs[name] = array
            except (EOFError, OSError) as exc:
                self._stop()
                raise DecodeWorkerError(
                    f"the JSON decode worker process ended ({exc!r}); retry the request, or "
                    "send the tensors as binary data"
                ) from None
            self.decoded += 1
        return InferRequest(request_id, inputs, outputs, binary_outputs, parameters)

    def _connection(self) -> Any:
        """The pipe to a running worker, started now if there is none (a fresh interpreter: this
        process runs
        threads, so it is never forked, and it is not re-imported as multiprocessing's spawn
        would)."""
        from multiprocessing.connection import Connection

        if self._process is None or self._process.poll() is not None:
            self._stop()
            ours, theirs = socket.socketpair()
            with ours, theirs:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", __name__, str(theirs.fileno()), str(self.niceness)],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                )
                self._conn = Connection(ours.detach())
        return self._conn

    def _stop(self) -> None:
        if self._conn is not None:
            self._conn.close()  # the worker exits when its pipe closes
            self._conn = None
        if self._process is not None:
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=5)
            self._process = None

    def close(self) -> None:
        """End the worker process (it exits when its pipe closes) and the talking thread."""
        with self._lock:
            self._stop()
        self._talker.shutdown(wait=False)


if __name__ == "__main__":
    from multiprocessing.connection import Connection

    _serve(Connection(int(sys.argv[1])), int(sys.argv[2]))
