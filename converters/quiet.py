"""Keeping third-party output off the user's terminal unless they asked for it (``edgesdk -v``).

Libraries under the converter print things the user cannot act on: ONNX Runtime's
quantizer prints calibration progress and logs advice on the root logger, LiteRT's C++
code writes "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." straight to file
descriptor 2, and every model load under the board's profile warns that the board's cores are
not this host's (true, and irrelevant to a conversion: :func:`warnings_once` drops it).
:func:`held_output` holds all of that for one step: it is dropped when the step succeeds
and appended to the error when it fails. :func:`warnings_once` shows each distinct
warning once. With :func:`edgesdk.logs.is_verbose` (``-v``, ``EDGESDK_VERBOSE=1``) both
let everything through. edgesdk's own log records always reach the terminal.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any, TextIO

from edgesdk.logs import is_verbose

__all__ = ["held_output", "warnings_once", "TAIL_LINES"]

#: How many of the held lines a failed step's error shows.
TAIL_LINES = 12
#: The runtime's notes on the cores it was given and on the board's GPU providers this host lacks: true on this host and
#: irrelevant to a conversion, which measures on this host's CPU and costs the board by its own model; kept off its terminal.
_HOST_NOTES = {"edgesdk.runtime.runtime": ("scheduling: ", "accelerator fallback: "),
               "edgesdk.runtime.backends.onnxruntime": ("onnxruntime fallback: ",),
               "edgesdk.runtime.backends.litert": ("LiteRT fallback: ",)}


def _handlers() -> list[logging.Handler]:
    """Where log records end up: the root logger's handlers, or Python's last resort when it has none."""
    handlers = list(logging.getLogger().handlers)
    if not handlers and logging.lastResort is not None:
        handlers.append(logging.lastResort)
    return handlers


def _writes_to_fd2(stream: Any) -> bool:
    try:
        return bool(stream.fileno() == 2)
    except (AttributeError, OSError, ValueError):  # io.StringIO, click's test runner, a closed stream
        return False


class _Once(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.first: dict[tuple[str, int, str], logging.LogRecord] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        if record.getMessage().startswith(_HOST_NOTES.get(record.name, ())):
            # Converting loads each variant under the board's profile on this host, whose cores and GPU differ: where a
            # measurement ran here says nothing about the board (its figures come from the board's own model).
            return False
        # The first record with this text passes every handler it reaches; later ones none.
        return self.first.setdefault((record.name, record.levelno, record.getMessage()), record) is record


@contextlib.contextmanager
def warnings_once() -> Iterator[None]:
    """While the block runs, show each distinct warning (logger, level, message) once, and none of the runtime's
    notes on this host's cores and missing GPU providers (they matter when running, not converting); all of them when
    verbose."""
    if is_verbose():
        yield
        return
    once = _Once()
    handlers = _handlers()
    for handler in handlers:
        handler.addFilter(once)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(once)


class _ThirdParty(logging.Filter):
    """Keeps records of loggers outside edgesdk (e.g. the quantizer's root-logger advice) in ``held``."""

    def __init__(self, held: list[str]) -> None:
        super().__init__()
        self.held = held
        self.last: logging.LogRecord | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "edgesdk" or record.name.startswith("edgesdk."):
            return True
        if record is not self.last:  # each handler asks about the same record
            self.last = record
            self.held.append(f"{record.levelname} {record.name}: {record.getMessage()}")
        return False


@contextlib.contextmanager
def held_output(step: str) -> Iterator[None]:
    """Hold what libraries print during ``step`` (Python prints and warnings, other loggers, C/C++ writes to fd 2).

    On success it is dropped; on failure the last :data:`TAIL_LINES` lines are appended to
    the error's message (or written to stderr when the error has no plain message). edgesdk's
    own log records reach the terminal as usual. Verbose: nothing is held.
    """
    if is_verbose():
        yield
        return
    held: list[str] = []
    printed = io.StringIO()
    sys.stdout.flush()
    sys.stderr.flush()
    saved_fd2 = os.dup(2)
    own_terminal = _writes_to_fd2(sys.stderr)
    # fd 2 is about to go to the hold file: edgesdk's records go to a copy of the real one.
    terminal: TextIO = (open(saved_fd2, "w", buffering=1, encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
                             errors="backslashreplace", closefd=False) if own_terminal else sys.stderr)
    root = logging.getLogger()
    standby = None
    if not root.handlers:
        # Stands in for Python's last resort handler (which writes to fd 2), and keeps a library's module-level
        # logging.warning() from calling basicConfig() and leaving a handler on the hold file behind.
        standby = logging.StreamHandler(terminal)
        standby.setLevel(logging.WARNING)
        root.addHandler(standby)
    retargeted = [h for h in root.handlers if isinstance(h, logging.StreamHandler) and _writes_to_fd2(h.stream)]
    previous = [h.stream for h in retargeted]
    third_party = _ThirdParty(held)
    for handler in root.handlers:
        handler.addFilter(third_party)
    for handler in retargeted:
        handler.setStream(terminal)
    with tempfile.TemporaryFile() as native:
        os.dup2(native.fileno(), 2)
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(printed):
                warnings.simplefilter("always")
                warnings.showwarning = lambda message, category, *_args, **_kw: held.append(
                    f"{category.__name__}: {message}")
                yield
        except Exception as exc:
            _attach_tail(exc, step, native, printed, held, terminal)
            raise
        finally:
            sys.stderr.flush()  # what it buffered was printed during the step: into the hold file
            os.dup2(saved_fd2, 2)
            for handler, stream in zip(retargeted, previous):
                handler.setStream(stream)
            for handler in root.handlers:
                handler.removeFilter(third_party)
            if standby is not None:
                root.removeHandler(standby)
            if own_terminal:
                terminal.close()
            os.close(saved_fd2)


def _attach_tail(exc: Exception, step: str, native: Any, printed: io.StringIO, held: list[str],
                 terminal: TextIO) -> None:
    """Add the end of what the failed step printed to its error, where the user will read it."""
    native.flush()
    native.seek(0)
    text = native.read().decode(errors="replace")
    lines = [line for chunk in (text, printed.getvalue(), "\n".join(held)) for line in chunk.splitlines() if line.strip()]
    if not lines:
        return
    tail = f"{step} printed (last lines):\n    " + "\n    ".join(lines[-TAIL_LINES:])
    if len(exc.args) == 1 and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]}\n  {tail}",)
    else:
        terminal.write(f"{tail}\n")
