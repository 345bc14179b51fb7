"""Run a page's code blocks in order, as one reader pasting them into one terminal would.

The session keeps what a terminal keeps between blocks: the working directory and the
exported environment (``cd`` and ``export``/``source`` in one block hold for the next), and
background commands (``... &``) keep running until the session closes. The commands run as
written, with these exceptions, all about this machine rather than the commands:

- ports 1883, 5432, 8080 and 8081 become free loopback ports (tests never take fixed ports);
- the system paths a page installs into (``/etc/edgesdk``, ``/etc/systemd/system``,
  ``/opt/edgesdk``, ``/var/lib/edgesdk``) move under ``$EDGESDK_DOC_ROOT``, a folder of the
  session's own ``HOME`` (a temp dir), so a page may show a device's install as root without
  touching this machine;
- ``systemctl`` and ``journalctl`` are stand-ins (``tests/docs/bin/``): no systemd runs here.
  They run a unit as systemd would start it, under that root (see their docstrings);
- after a background command the runner waits, as a reader would, until it is ready:
  ``mosquitto`` until its port answers, ``edgesdk server`` until it prints its admin API
  address, ``edgesdk agent`` until it prints that it is connected, the throwaway
  PostgreSQL until it prints ``ready``. A background command that exits before it is ready
  fails the block with its log.

A page may also get environment of its own (``env``): docs/deploy.md installs ``edgesdk``
with pip from this checkout's wheel, not from the package index.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from edgesdk.ota_server.broker import free_port
from tests.docs.markdown import RUNNABLE, Block, commands

__all__ = ["DocSession", "BlockResult"]

#: The stand-ins for systemctl and journalctl, first on the session's PATH.
_STAND_INS = Path(__file__).resolve().parent / "bin"
#: System paths a page may install into; they move under the session's root.
_SYSTEM_PATHS = re.compile(r"(?<![\w/.~-])/(?:etc/edgesdk|etc/systemd/system|opt/edgesdk|var/lib/edgesdk)\b")

_PRELUDE = r"""
set -eo pipefail
__state={state}
trap 'pwd > "$__state/cwd"; env -0 > "$__state/env"' EXIT
__wait_port() {{  # PORT PID LOG
  for _ in $(seq 1 600); do
    (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || {{ echo "background command exited before listening on $1:" >&2; cat "$3" >&2; return 1; }}
    sleep 0.1
  done
  echo "nothing listens on port $1 after 60 s:" >&2; cat "$3" >&2; return 1
}}
__wait_line() {{  # PATTERN PID LOG
  for _ in $(seq 1 1200); do
    grep -q -- "$1" "$3" 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || {{ echo "background command exited before printing '$1':" >&2; cat "$3" >&2; return 1; }}
    sleep 0.1
  done
  echo "no '$1' after 120 s:" >&2; cat "$3" >&2; return 1
}}
"""


@dataclass
class BlockResult:
    block: Block
    returncode: int
    output: str


@dataclass
class DocSession:
    """One reader's terminal: ``cwd`` and ``env`` carry over from block to block."""

    cwd: Path
    home: Path
    broker_port: int
    http_port: int
    timeout_s: float = 900.0
    env: dict[str, str] = field(default_factory=dict)
    _groups: list[int] = field(default_factory=list)
    _count: int = 0

    def __post_init__(self) -> None:
        self.state = self.home / ".doc-session"
        self.state.mkdir(parents=True, exist_ok=True)
        self.root = self.home / "root"
        for folder in ("etc/systemd/system", "opt", "var/lib"):  # what every systemd machine has
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        self.ports = {1883: self.broker_port, 8080: self.http_port, 8081: free_port(), 5432: free_port()}
        path = f"{_STAND_INS}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"
        self.env = {**os.environ, **self.env, "HOME": str(self.home), "PATH": path,
                    "EDGESDK_DOC_ROOT": str(self.root)}

    def substitute(self, code: str) -> str:
        for port, free in self.ports.items():
            code = re.sub(rf"\b{port}\b", str(free), code)
        return _SYSTEM_PATHS.sub(lambda m: str(self.root) + m.group(0), code)

    def _background(self, command: str) -> str:
        """``cmd &`` -> run it with its output in a log, then wait until it is ready."""
        self._count += 1
        log = self.state / f"background-{self._count}.log"
        words = shlex.split(command.rstrip("& "))
        started = f"{command.rstrip('& ')} >> {shlex.quote(str(log))} 2>&1 &\n__pid=$!\n"
        if words[0] == "mosquitto":
            return started + f"__wait_port {self.broker_port} $__pid {shlex.quote(str(log))}\n"
        if words[:2] == ["edgesdk", "server"]:
            return started + f"__wait_line 'admin API' $__pid {shlex.quote(str(log))}\n"
        if words[:2] == ["edgesdk", "agent"]:
            return started + f"__wait_line 'connected' $__pid {shlex.quote(str(log))}\n"
        if words[:3] == ["python", "-m", "edgesdk.ota_server.postgres"]:
            return started + f"__wait_line 'ready:' $__pid {shlex.quote(str(log))}\n"
        return started

    def _script(self, block: Block) -> str:
        lines = commands(self.substitute(block.code))
        if block.only is not None:
            lines = lines[: block.only]
        body = "".join(self._background(c) if c.rstrip().endswith("&") and not c.rstrip().endswith("&&")
                       else c + "\n" for c in lines)
        return _PRELUDE.format(state=shlex.quote(str(self.state))) + body

    def run(self, block: Block) -> BlockResult:
        kind = RUNNABLE[block.lang]
        self._count += 1
        if kind == "bash":
            script = self.state / f"block-{self._count}.sh"
            script.write_text(self._script(block))
            argv = ["bash", str(script)]
        else:
            script = self.state / f"block-{self._count}.py"
            script.write_text(self.substitute(block.code))
            argv = [sys.executable, str(script)]
        process = subprocess.Popen(argv, cwd=self.cwd, env=self.env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self._groups.append(process.pid)
        try:
            output, _ = process.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            output += f"\n[runner: killed after {self.timeout_s:g} s]"
        if kind == "bash" and (self.state / "cwd").exists():
            self.cwd = Path((self.state / "cwd").read_text().strip())
            pairs = (self.state / "env").read_bytes().split(b"\0")
            self.env = dict(p.decode().split("=", 1) for p in pairs if b"=" in p)
        return BlockResult(block, process.returncode, output)

    def logs(self) -> str:
        """Everything the background commands printed (for a failure message)."""
        return "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(self.state.glob("background-*.log")))

    def close(self) -> None:
        """Stop every background command the blocks started (each block ran in its own process group)."""
        for group in self._groups:
            try:
                os.killpg(group, signal.SIGTERM)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + 10
        for group in self._groups:
            while time.monotonic() < deadline:
                try:
                    os.killpg(group, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
            else:
                try:
                    os.killpg(group, signal.SIGKILL)
                except ProcessLookupError:
                    pass
