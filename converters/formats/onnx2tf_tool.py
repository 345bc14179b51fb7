"""The onnx2tf tool environment: a virtualenv of its own, made on first use, and the runner of its processes.

**The tool environment.** onnx2tf pins its own stack (TensorFlow 2.19, numpy 1.26,
onnxruntime 1.23, ...) that cannot live beside edgesdk's (numpy 2), so edgesdk never
installs it into your environment. On first use, :meth:`Onnx2TfTool.ensure` creates a
virtualenv with the Python that runs edgesdk (``python -m venv``) and pip-installs
``onnx2tf==1.29.24`` into it (about a minute; needs PyPI, or your pip index settings). It
lives in ``$EDGESDK_TOOLS_DIR/onnx2tf-1.29.24``, by default
``~/.cache/edgesdk/tools/onnx2tf-1.29.24`` (about 2.6 GB; the install says so before it
starts), and is reused by every later conversion. A marker
file is written only after a successful install, so an interrupted install is wiped and
redone, never used; delete the directory to reinstall. onnx2tf then runs as a subprocess
(``<env>/bin/python -m onnx2tf``) in a temporary directory, offline.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from edgesdk.errors import ConversionError
from edgesdk.files import write_atomic

__all__ = ["run_logged", "Onnx2TfTool", "ToolRun", "ONNX2TF_VERSION", "TOOLS_DIR_ENV"]

log = logging.getLogger("edgesdk.converters.formats.tflite")

#: The onnx2tf release edgesdk installs and drives (its flags and log format are parsed).
ONNX2TF_VERSION = "1.29.24"
TOOLS_DIR_ENV = "EDGESDK_TOOLS_DIR"
_REQUIREMENT = f"onnx2tf=={ONNX2TF_VERSION}"


def _default_location() -> Path:
    root = os.environ.get(TOOLS_DIR_ENV) or Path.home() / ".cache" / "edgesdk" / "tools"
    return Path(root) / f"onnx2tf-{ONNX2TF_VERSION}"


def run_logged(command: Sequence[str], cwd: Path, log_path: Path, timeout_s: float, env: Mapping[str, str]) -> int:
    """Run ``command`` with stdout+stderr appended to ``log_path``; kill its whole process group on timeout."""
    with open(log_path, "ab") as log_file:
        log_file.write(f"$ {' '.join(command)}\n".encode())
        log_file.flush()
        process = subprocess.Popen(command, cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=log_file,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return process.wait(timeout=timeout_s)
        except BaseException:  # the timeout, or Ctrl-C: leave no converter running behind us
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise


@dataclass(frozen=True)
class ToolRun:
    """One finished onnx2tf run: its command, exit status, log file and duration."""

    command: tuple[str, ...]
    returncode: int
    log_path: Path
    seconds: float


@dataclass(frozen=True)
class Onnx2TfTool:
    """The virtualenv holding onnx2tf, outside the user's environment (see the module docstring)."""

    location: Path = field(default_factory=_default_location)

    @property
    def python(self) -> Path:
        """The tool environment's Python interpreter."""
        return self.location / "bin" / "python"

    @property
    def marker(self) -> Path:
        """Written last by :meth:`ensure`; without it the directory is a broken install."""
        return self.location / ".edgesdk-installed"

    @property
    def installed(self) -> bool:
        """True only for a complete install of the pinned onnx2tf whose Python still exists."""
        try:
            return self.python.exists() and self.marker.read_text().strip() == _REQUIREMENT
        except OSError:
            return False

    def _env(self) -> dict[str, str]:
        """The caller's environment minus anything that would mix in its packages."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env["PATH"] = f"{self.python.parent}{os.pathsep}{env.get('PATH', '')}"  # onnx2tf runs the onnxsim script
        env["PYTHONNOUSERSITE"] = "1"
        return env

    def ensure(self, timeout_s: float = 1800, announce: Callable[[str], None] | None = None) -> Onnx2TfTool:
        """Install the tool environment unless a complete one exists; safe to call from several processes.

        Before installing, ``announce`` (default: a log warning) is told what is about to happen and where.
        """
        if self.installed:
            return self
        message = f"installing the onnx2tf tool environment (about 2.6 GB, a minute or more) in {self.location}"
        if announce is None:
            log.warning("%s", message)
        else:
            announce(message)
        self.location.parent.mkdir(parents=True, exist_ok=True)
        with open(self.location.with_name(self.location.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.installed:  # another process finished it while we waited
                return self
            if self.location.exists():
                log.warning("removing the incomplete onnx2tf environment at %s", self.location)
                shutil.rmtree(self.location)
            self.location.mkdir()
            self._install(timeout_s)
            write_atomic(self.marker, f"{_REQUIREMENT}\n".encode())
        return self

    def _install(self, timeout_s: float) -> None:
        log_path = self.location / "install.log"
        steps = [
            ([sys.executable, "-m", "venv", str(self.location)],
             f"make sure `{sys.executable} -m venv` works (on Debian/Ubuntu: apt-get install python3-venv)"),
            ([str(self.python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", _REQUIREMENT],
             "check that PyPI (or your PIP_INDEX_URL) is reachable and that this Python version has TensorFlow "
             "2.19 wheels (3.9 to 3.12)"),
        ]
        for command, fix in steps:
            try:
                code = run_logged(command, self.location, log_path, timeout_s, self._env())
            except subprocess.TimeoutExpired as exc:
                raise ConversionError(f"installing onnx2tf: `{' '.join(command)}` did not finish in {timeout_s:.0f} s; "
                                      f"see {log_path}; {fix}, then try again") from exc
            if code != 0:
                raise ConversionError(f"installing onnx2tf: `{' '.join(command)}` failed (exit {code}); see {log_path}; "
                                      f"{fix}, then try again (the incomplete environment is replaced)")

    def run(self, args: Sequence[str], cwd: Path, timeout: float) -> ToolRun:
        """Run ``python -m onnx2tf *args`` in ``cwd``, logging to ``cwd/onnx2tf.log``; a failed run is returned."""
        if not self.installed:
            raise ConversionError(f"onnx2tf is not installed at {self.location}; call Onnx2TfTool().ensure() first")
        command = (str(self.python), "-m", "onnx2tf", *args)
        log_path = Path(cwd) / "onnx2tf.log"
        started = time.perf_counter()
        try:
            code = run_logged(command, Path(cwd), log_path, timeout, self._env())
        except subprocess.TimeoutExpired as exc:
            raise ConversionError(f"`{' '.join(command)}` did not finish in {timeout:.0f} s (log: {log_path}); "
                                  "raise timeout_s, or simplify the model first") from exc
        return ToolRun(command, code, log_path, time.perf_counter() - started)
