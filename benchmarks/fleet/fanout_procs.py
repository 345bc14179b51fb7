"""Fan-out as a fleet runs it: every device in its own interpreter (issue 13, item 3).

Two harnesses for benchmarks/fleet/ota.py, both over a real broker on loopback:

* :class:`AgentProcesses` starts ``n`` child processes, each running ONE real
  :class:`~edgesdk.agent.DeviceAgent` (device ids ``dev00``, ``dev01``, ...), as on real devices. A child
  prints, when its agent reports ``accepted`` and ``downloaded``, its process CPU seconds and wall clock,
  so the parent learns per-device CPU of a transfer without sharing an interpreter with it.
* :func:`raw_verifying_fanout` is the baseline: ``n`` child subscribers that do only the irreducible
  work of an agent per chunk (SHA-256 checked against the chunk table, ``os.pwrite`` at the chunk's offset,
  a running whole-file SHA-256 in order, the final compare), while the parent publishes every chunk once.

Children talk to the parent in text lines (stdout: protocol lines only; their own output goes to
stderr, kept in a log file)::

    ready <cpu_s> <wall>                     started, subscribed, idle
    cpu <cpu_s>                              answer to "cpu" on stdin
    accepted|downloaded <deployment> <cpu_s> <wall>   (agent children)
    done <cpu_s> <wall> <verified 0|1> <rejected>     (raw children, once every chunk arrived)

``stop`` on stdin, or stdin's end (the parent died), makes a child exit. Children run as
``python -m benchmarks.fleet.fanout_procs agent|raw ...`` from the repository root.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from edgesdk.errors import EdgeSDKError

__all__ = ["AgentProcesses", "raw_verifying_fanout", "FanoutError", "MAX_CHILDREN"]

REPO = Path(__file__).resolve().parents[2]
#: The most child processes one harness starts (each is a whole interpreter).
MAX_CHILDREN = 500
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class FanoutError(EdgeSDKError):
    """A fan-out harness was given bad input, or its child processes did not start or report in time."""


# ------------------------------------------------------------------------------------------------
# parent side
# ------------------------------------------------------------------------------------------------

def _check_setup(broker_url: str, n: int) -> None:
    from edgesdk.fleet.transport import parse_broker_url

    address = parse_broker_url(broker_url)
    if address.tls or address.host not in _LOOPBACK:
        raise FanoutError(f"broker {broker_url!r}: the fan-out harness runs on loopback only; give mqtt://127.0.0.1:PORT")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHILDREN:
        raise FanoutError(f"n={n!r} must be an integer in 1..{MAX_CHILDREN} (one interpreter per child)")


class _Child:
    """One child process: its stdin, a thread reading its protocol lines, its stderr in a log file."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name, self.log_path = name, log_path
        self._log = open(log_path, "wb")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        self.process = subprocess.Popen([sys.executable, "-m", "benchmarks.fleet.fanout_procs", *argv], cwd=REPO, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        self._lines: list[list[str]] = []
        self._ended = False
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, name=f"fanout-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            fields = raw.decode(errors="replace").split()
            if fields:
                with self._changed:
                    self._lines.append(fields)
                    self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def send(self, line: str) -> bool:
        """Write one line to the child's stdin; False when the child is gone."""
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(line.encode() + b"\n")
            self.process.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def take(self, match: Callable[[list[str]], bool], deadline: float, pop: bool = False) -> list[str] | None:
        """The first line ``match`` accepts, waiting until ``deadline`` (monotonic); None if none came or it exited."""
        with self._changed:
            while True:
                for i, fields in enumerate(self._lines):
                    if match(fields):
                        return self._lines.pop(i) if pop else fields
                remaining = deadline - time.monotonic()
                if self._ended or remaining <= 0:
                    return None
                self._changed.wait(remaining)

    def tail(self, chars: int = 600) -> str:
        """The end of the child's stderr log (with its exit status when it has exited)."""
        self._log.flush()
        try:
            text = self.log_path.read_text(errors="replace")[-chars:].strip() or "(empty stderr)"
        except OSError:
            text = "(no log)"
        code = self.process.poll()
        return text if code is None else f"exited with {code}; {text}"

    def rss_mb(self) -> float:
        """Resident set size (VmRSS) in MiB; 0.0 once the process is gone."""
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    def stop(self, deadline: float) -> None:
        """Ask the child to stop (stdin closed), wait until ``deadline``, then kill it."""
        self.send("stop")
        try:
            assert self.process.stdin is not None
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def close(self) -> None:
        """Release the pipes and the log once the process has exited."""
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._reader.join(timeout=5)
        self._log.close()


def _collect(children: Sequence[_Child], match: Callable[[list[str]], bool], timeout: float, what: str,
             pop: bool = False) -> list[list[str]]:
    """One matching line from every child within ``timeout`` s, else FanoutError naming those that did not send it."""
    deadline = time.monotonic() + timeout
    found = [child.take(match, deadline, pop) for child in children]
    missing = [child for child, fields in zip(children, found) if fields is None]
    if missing:
        details = "; ".join(f"{c.name}: {c.tail()}" for c in missing[:5])
        raise FanoutError(f"{len(missing)} of {len(children)} children ({', '.join(c.name for c in missing[:20])}"
                          f"{', ...' if len(missing) > 20 else ''}) sent no {what} within {timeout:g} s; "
                          f"their stderr: {details}")
    return [fields for fields in found if fields is not None]


def _stop_all(children: Sequence[_Child], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    for child in children:  # everyone hears "stop" first, then we wait: they exit in parallel
        child.send("stop")
    for child in children:
        child.stop(deadline)
        child.close()


def _is_ready(fields: list[str]) -> bool:
    return fields[0] == "ready"


class AgentProcesses:
    """``n`` real device agents, one per child process, devices ``dev00``.. of ``group``; a context manager.

    ``agent_options`` are AgentConfig fields (JSON values: ``retry_interval_s``, ``broadcast_wait_s``,
    ``profile`` as a name, ...). Each agent's store is ``store_root/<device>``, its stderr
    ``store_root/logs/<device>.log``. The constructor returns once every agent is connected and has
    published its state; :attr:`startup_s` is how long that took. On any error every child is stopped.
    """

    def __init__(self, broker_url: str, server_pub_key_path: str | os.PathLike[str], store_root: str | os.PathLike[str],
                 n: int, group: str, *, ready_timeout: float = 180.0, **agent_options: Any) -> None:
        _check_setup(broker_url, n)
        if not Path(server_pub_key_path).is_file():
            raise FanoutError(f"server public key {server_pub_key_path} does not exist; pass the .pub file that pairs "
                              "with the server's signing key (edgesdk keygen)")
        try:
            options = json.dumps(agent_options)
        except TypeError as exc:
            raise FanoutError(f"agent options {agent_options!r} must be JSON values (numbers, strings, booleans): "
                              f"{exc}") from exc
        root = Path(store_root)
        (root / "logs").mkdir(parents=True, exist_ok=True)
        #: Device ids, in the order of every per-child list this class returns.
        self.devices = [f"dev{i:02d}" for i in range(n)]
        started = time.monotonic()
        self._children: list[_Child] = []
        try:
            for device in self.devices:
                argv = ["agent", "--broker", broker_url, "--key", str(Path(server_pub_key_path).resolve()),
                        "--store", str((root / device).resolve()), "--device", device, "--group", group,
                        "--options", options]
                self._children.append(_Child(device, argv, root / "logs" / f"{device}.log"))
            _collect(self._children, _is_ready, ready_timeout, "'ready' (agent started and connected)")
        except BaseException:
            _stop_all(self._children)
            raise
        #: Seconds from the first spawn until every agent was connected and idle.
        self.startup_s = time.monotonic() - started

    def __enter__(self) -> AgentProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pids(self) -> list[int]:
        """Process ids of the children, in device order."""
        return [child.process.pid for child in self._children]

    def rss_mb(self) -> list[float]:
        """Each child's resident set size now, in MiB (device order)."""
        return [child.rss_mb() for child in self._children]

    def cpu_now(self, timeout: float = 30.0) -> list[float]:
        """Each child's process CPU seconds so far (user + system, all threads), in device order."""
        for child in self._children:
            child.send("cpu")
        lines = _collect(self._children, lambda f: f[0] == "cpu", timeout, "answer to 'cpu'", pop=True)
        return [float(fields[1]) for fields in lines]

    def wait_event(self, event: str, deployment_id: str, timeout: float) -> list[tuple[float, float]]:
        """``(cpu_s, wall)`` of every child when its agent reported ``event`` ("accepted" or "downloaded") for
        ``deployment_id``, in device order; FanoutError names the children that did not within ``timeout`` s."""
        if event not in ("accepted", "downloaded"):
            raise FanoutError(f"event {event!r} is not reported by the children; wait for 'accepted' or 'downloaded'")
        lines = _collect(self._children, lambda f: f[:2] == [event, deployment_id], timeout,
                         f"'{event} {deployment_id}'")
        return [(float(fields[2]), float(fields[3])) for fields in lines]

    def wait_downloaded(self, deployment_id: str, timeout: float) -> list[tuple[float, float]]:
        """``(cpu_s, wall)`` of every child once its agent holds the verified archive of ``deployment_id``."""
        return self.wait_event("downloaded", deployment_id, timeout)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every agent (it publishes itself offline), killing those still running after ``timeout`` s."""
        children, self._children = self._children, []
        _stop_all(children, timeout)


def raw_verifying_fanout(broker_url: str, data: bytes, info: Any, n: int, round_id: str,
                         workdir: str | os.PathLike[str], *, timeout: float = 600.0) -> dict[str, Any]:
    """Publish every chunk of ``data`` once (QoS 1) to ``n`` subscriber processes that verify and write it.

    ``info`` is the archive's :class:`~edgesdk.fleet.protocol.ArchiveInfo` (``chunks``, ``size``, ``sha256``,
    ``chunk_range``). Returns ``{"wall_s", "cpu_s", "verified", "startup_s"}``: seconds from the first
    publish until the last child was done, each child's CPU seconds from ready to done, how many
    children's whole-file hash matched, and how long the children took to start. Files (chunk table,
    each child's copy, logs) live under ``workdir/raw-<round_id>``; the copies are removed afterwards.
    """
    from edgesdk.fleet.protocol import check_id
    from edgesdk.fleet.transport import MqttTransport

    _check_setup(broker_url, n)
    check_id(round_id, "round id")
    if len(data) != info.size:
        raise FanoutError(f"data is {len(data)} bytes but the chunk table describes {info.size}; pass the archive the "
                          "table was made from")
    folder = Path(workdir) / f"raw-{round_id}"
    folder.mkdir(parents=True, exist_ok=True)
    ranges = [info.chunk_range(i) for i in range(len(info.chunks))]
    table = folder / "table.json"
    table.write_text(json.dumps({"hashes": list(info.chunks), "offsets": [s for s, _ in ranges],
                                 "sizes": [e - s for s, e in ranges], "sha256": info.sha256, "size": info.size}))
    children: list[_Child] = []
    publisher = None
    try:
        started = time.monotonic()
        for i in range(n):
            argv = ["raw", "--broker", broker_url, "--table", str(table.resolve()), "--round", round_id,
                    "--out", str((folder / f"{i}.part").resolve()), "--client-id", f"raw-{round_id}-{i}"]
            children.append(_Child(f"raw{i}", argv, folder / f"raw{i}.log"))
        ready = _collect(children, _is_ready, min(timeout, 180.0), "'ready' (subscribed)")
        startup_s = time.monotonic() - started
        publisher = MqttTransport(broker_url, client_id=f"raw-pub-{round_id}")
        publish_start = time.time()
        for index, (start, end) in enumerate(ranges):
            publisher.publish(f"raw/{round_id}/{index}", data[start:end])
        done = _collect(children, lambda f: f[0] == "done", timeout, "'done' (every chunk received)")
    finally:
        if publisher is not None:
            publisher.close()
        _stop_all(children)
        for part in folder.glob("*.part"):
            part.unlink()
    return {"wall_s": max(float(f[2]) for f in done) - publish_start,
            "cpu_s": [float(d[1]) - float(r[1]) for r, d in zip(ready, done)],
            "verified": sum(f[3] == "1" for f in done), "startup_s": startup_s}


# ------------------------------------------------------------------------------------------------
# child side
# ------------------------------------------------------------------------------------------------

class _Out:
    """The protocol channel to the parent: the original stdout, one lock, a flush per line."""

    def __init__(self) -> None:
        self._stream: IO[str] = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)  # anything else a library prints goes to the log, not into the protocol
        sys.stdout = sys.stderr
        self._lock = threading.Lock()

    def line(self, *fields: object) -> None:
        """Send one protocol line."""
        with self._lock:
            self._stream.write(" ".join(map(str, fields)) + "\n")
            self._stream.flush()


def _serve_stdin(out: _Out) -> None:
    """Answer ``cpu`` until ``stop`` or the end of stdin (the parent stopped us, or died)."""
    for line in sys.stdin:
        command = line.strip()
        if command == "cpu":
            out.line("cpu", time.process_time())
        elif command == "stop":
            return


def _agent_main(args: argparse.Namespace) -> None:
    import logging

    from edgesdk.agent.agent import DeviceAgent
    from edgesdk.agent.config import AgentConfig
    from edgesdk.fleet.records import AgentEvent
    from edgesdk.runtime.signing import load_public_key

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format=f"{args.device} %(levelname)s %(message)s")
    out = _Out()
    timed = {AgentEvent.ACCEPTED, AgentEvent.DOWNLOADED}

    class TimedAgent(DeviceAgent):
        """A DeviceAgent that tells the parent its CPU seconds and wall clock when it accepts and downloads."""

        def _event(self, about: Any, event: AgentEvent, **details: Any) -> None:
            cpu, wall = time.process_time(), time.time()
            super()._event(about, event, **details)
            if event in timed and about is not None:
                out.line(str(event), about.deployment_id, cpu, wall)

    config = AgentConfig(device_id=args.device, group=args.group, broker=args.broker, store=Path(args.store),
                         server_key=load_public_key(args.key), **json.loads(args.options))
    agent = TimedAgent(config).start()
    try:
        out.line("ready", time.process_time(), time.time())
        _serve_stdin(out)
    finally:
        agent.stop()


class _VerifyingWriter:
    """The irreducible per-chunk work of an agent: hash check, positioned write, running whole-file hash in order."""

    def __init__(self, table: dict[str, Any], path: str, finished: Callable[[bool, int], None]) -> None:
        self.hashes: list[str] = table["hashes"]
        self.offsets: list[int] = table["offsets"]
        self.sizes: list[int] = table["sizes"]
        self.sha256: str = table["sha256"]
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(self.fd, int(table["size"]))
        self.seen: set[int] = set()
        self.good: set[int] = set()
        self.digest = hashlib.sha256()
        self.digested = 0
        self.rejected = 0
        self._finished = finished
        self._lock = threading.Lock()

    def on_chunk(self, topic: str, payload: bytes) -> None:
        """Check, write and fold in one chunk; once every index arrived, compare the whole-file hash."""
        tail = topic.rsplit("/", 1)[-1]
        index = int(tail) if tail.isdigit() else -1
        with self._lock:
            if index in self.seen:
                return  # a QoS 1 duplicate
            if not 0 <= index < len(self.hashes) or len(payload) != self.sizes[index] \
                    or hashlib.sha256(payload).hexdigest() != self.hashes[index]:
                self.rejected += 1
                if 0 <= index < len(self.hashes):
                    self.seen.add(index)
            else:
                self.seen.add(index)
                self.good.add(index)
                os.pwrite(self.fd, payload, self.offsets[index])
                self._advance(payload if index == self.digested else None)
            if len(self.seen) == len(self.hashes):
                verified = self.digested == len(self.hashes) and self.digest.hexdigest() == self.sha256
                self._finished(verified, self.rejected)

    def _advance(self, payload: bytes | None) -> None:
        """Fold consecutive good chunks into the running hash; out-of-order ones are read back from the file."""
        while self.digested < len(self.hashes) and self.digested in self.good:
            if payload is None:
                payload = os.pread(self.fd, self.sizes[self.digested], self.offsets[self.digested])
            self.digest.update(payload)
            self.digested += 1
            payload = None


def _raw_main(args: argparse.Namespace) -> None:
    from edgesdk.fleet.transport import MqttTransport

    out = _Out()
    table = json.loads(Path(args.table).read_text())

    def finished(verified: bool, rejected: int) -> None:
        out.line("done", time.process_time(), time.time(), int(verified), rejected)

    writer = _VerifyingWriter(table, args.out, finished)
    transport = MqttTransport(args.broker, client_id=args.client_id)
    try:
        transport.subscribe(f"raw/{args.round}/#", writer.on_chunk)
        transport.confirm_access()  # subscribed before "ready": no chunk can go by unseen
        out.line("ready", time.process_time(), time.time())
        _serve_stdin(out)
    finally:
        transport.close()
        os.close(writer.fd)


def main(argv: list[str] | None = None) -> None:
    """Entry of a child process: ``agent`` (one DeviceAgent) or ``raw`` (one verifying subscriber)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet.fanout_procs", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    agent = sub.add_parser("agent", help="run one device agent")
    for name in ("--broker", "--key", "--store", "--device", "--group", "--options"):
        agent.add_argument(name, required=True)
    raw = sub.add_parser("raw", help="run one verifying raw subscriber")
    for name in ("--broker", "--table", "--round", "--out", "--client-id"):
        raw.add_argument(name, required=True)
    args = parser.parse_args(argv)
    (_agent_main if args.role == "agent" else _raw_main)(args)


if __name__ == "__main__":
    main()
