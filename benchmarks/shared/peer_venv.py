"""A third-party tool in a virtualenv of its own, built once and cached (peers of the benchmarks, protoc).

Peers such as NNCF, MLServer and PyTriton pin dependencies edgesdk's environment must not take
(an older numpy, another protobuf, a web framework), so each lives in
``~/.cache/edgesdk/venvs/<name>`` (an environment variable may override the place), created on
first use with ``python -m venv`` and ``pip install`` of pinned requirements.

The install is built in a temporary sibling directory, checked (a line of Python run with the
new interpreter, e.g. ``import mlserver``), marked (requirements, install seconds, size, ``pip
freeze``), then renamed into place, under a file lock: an interrupted install leaves only a
``.building-*`` directory (removed by the next install), never a half-made environment. A
changed requirement list makes the next :meth:`PeerVenv.ensure` rebuild it. Only the
interpreter (``bin/python``) is used: the scripts in ``bin/`` keep the temporary path in their
``#!`` lines. Installing needs PyPI (or the pip index settings).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

__all__ = ["PeerVenv", "PeerVenvError", "clean_env", "log_tail", "VENVS"]

#: Where the environments live unless their variable says otherwise.
VENVS = Path.home() / ".cache" / "edgesdk" / "venvs"
_TAIL = 4000


class PeerVenvError(RuntimeError):
    """The environment could not be installed (the message has the install log's tail)."""


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment minus anything that would mix edgesdk's packages into the other Python."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PYTHONNOUSERSITE"] = "1"
    env.update(extra or {})
    return env


def log_tail(path: Path, limit: int = _TAIL) -> str:
    """The last ``limit`` characters of a log file (``(no log)`` when there is none)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return text if len(text) <= limit else "..." + text[-limit:]


def _dir_bytes(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _run_logged(command: list[str], log_path: Path, timeout_s: float, env: Mapping[str, str]) -> int:
    from edgesdk.converters.formats.onnx2tf_tool import run_logged  # its own process group, killed on timeout

    return run_logged(command, log_path.parent, log_path, timeout_s, env)


@dataclass(frozen=True)
class PeerVenv:
    """A cached virtualenv holding ``requirements`` (see the module docstring)."""

    location: Path
    requirements: tuple[str, ...]
    #: Python source run with the new interpreter before the environment is accepted.
    check: str
    #: The interpreter the environment is made from (PyTriton needs the system Python its stub links to).
    base_python: str = sys.executable
    #: Added to the clean environment of the install and the check.
    extra_env: Mapping[str, str] = field(default_factory=dict)
    #: What :meth:`ensure` raises (a peer may keep its own error type).
    error: ClassVar[type[Exception]] = PeerVenvError

    @classmethod
    def named(cls, name: str, requirements: tuple[str, ...], check: str, env_var: str | None = None,
              **options: Any) -> PeerVenv:
        """The environment ``~/.cache/edgesdk/venvs/<name>``, or where ``$env_var`` points."""
        override = os.environ.get(env_var) if env_var else None
        return cls(Path(override) if override else VENVS / name, requirements, check, **options)

    @property
    def python(self) -> Path:
        """The environment's interpreter."""
        return self.location / "bin" / "python"

    @property
    def marker(self) -> Path:
        """Written before the rename into place; holds the requirements, install time and size."""
        return self.location / ".edgesdk-installed.json"

    def info(self) -> dict[str, Any] | None:
        """The marker's content (requirements, install_s, size_bytes, freeze), or None without a complete install."""
        try:
            info = json.loads(self.marker.read_text())
        except (OSError, ValueError):
            return None
        return info if self.python.exists() and info.get("requirements") == list(self.requirements) else None

    @property
    def installed(self) -> bool:
        """True for a complete install of exactly :attr:`requirements`."""
        return self.info() is not None

    def ensure(self, timeout_s: float = 1800, announce: Callable[[str], None] | None = None) -> float | None:
        """Install unless a complete environment exists; returns the install's seconds, or None if it was there.

        Safe to call from several processes at once (a file lock; the loser finds the winner's install).
        """
        if self.installed:
            return None
        parent = self.location.parent
        parent.mkdir(parents=True, exist_ok=True)
        with open(parent / f"{self.location.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.installed:
                return None
            (announce or (lambda m: print(m, file=sys.stderr, flush=True)))(
                f"installing {' '.join(self.requirements) or 'an empty environment'} into {self.location} (once)")
            for stale in parent.glob(f".{self.location.name}.building-*"):
                shutil.rmtree(stale, ignore_errors=True)
            building = Path(tempfile.mkdtemp(prefix=f".{self.location.name}.building-", dir=parent))
            building.chmod(0o755)
            try:
                seconds = self._build(building, timeout_s)
                if self.location.exists():  # an older or broken install: move it aside, then swap
                    old = building.with_name(building.name + ".old")
                    os.rename(self.location, old)
                    os.rename(building, self.location)
                    shutil.rmtree(old, ignore_errors=True)
                else:
                    os.rename(building, self.location)
            finally:
                shutil.rmtree(building, ignore_errors=True)
            return seconds

    def _build(self, where: Path, timeout_s: float) -> float:
        log_path = where.parent / f"{self.location.name}.install.log"
        log_path.write_text("")
        python = where / "bin" / "python"
        started = time.perf_counter()
        # Without requirements nothing is installed, so no pip either (a tenth of a second instead of five).
        steps = [[self.base_python, "-m", "venv", "--clear", *([] if self.requirements else ["--without-pip"]), str(where)]]
        if self.requirements:
            steps.append([str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
                          *self.requirements])
        steps.append([str(python), "-c", self.check])
        env = clean_env(self.extra_env)
        for command in steps:
            left = timeout_s - (time.perf_counter() - started)
            try:
                code = _run_logged(command, log_path, max(left, 1), env)
            except subprocess.TimeoutExpired as exc:
                raise self.error(f"installing {self.location.name}: `{' '.join(command)}` did not finish within "
                                 f"{timeout_s:.0f} s; log {log_path}:\n{log_tail(log_path)}") from exc
            if code != 0:
                raise self.error(f"installing {self.location.name}: `{' '.join(command)}` failed (exit {code}); check "
                                 f"that PyPI (or your pip index) is reachable; log {log_path}:\n{log_tail(log_path)}")
        seconds = time.perf_counter() - started
        freeze = subprocess.run([str(python), "-m", "pip", "freeze", "--all"], capture_output=True, text=True,
                                env=env, check=False).stdout.split() if self.requirements else []
        info = {"requirements": list(self.requirements), "install_s": round(seconds, 1),
                "size_bytes": _dir_bytes(where), "python": self.base_python, "freeze": freeze}
        (where / self.marker.name).write_text(json.dumps(info, indent=1))
        return seconds
