"""A variant's answers on the board: its first output on evaluation samples, by the board's runtime.

:mod:`.emulate` counts instructions on one sample; accuracy needs the board's answers on many. This
module runs a model on a bounded number of samples (``max_samples``, 64 by default) in the same
aarch64 userland and under the same ``qemu-aarch64 -cpu <core>`` as the counts, but without the
counting plugin (several times faster), split across processes so every usable core of this host
works (contiguous chunks of the samples, one process per chunk, each single-threaded, each loading
the model once). The guest script is :mod:`._guest_outputs`.

The result has the layout of :attr:`edgesdk.converters.board.measure.Measurement.outputs`: each
sample's first output, concatenated along the batch axis in sample order. It is cached by model
SHA-256 x emulated CPU x runtime (library versions and qemu) x the input bytes, beside the
emulator's counts (``outputs/``), written atomically: a second conversion with the same data reads a
file.

A variant whose board run fails is a :class:`~edgesdk.errors.BoardRuntimeError` naming why: the
board's runtime refused it (its error line), the process crashed (its exit status or signal), no
sample finished within ``timeout_s`` (a hang; the timeout is per sample, not for the whole run, so a
large model on many samples is not cut off for being slow), or an output is not finite (NaN or
infinity, as an FP16 accumulation that overflows on the board gives). The caller vetoes that variant
alone. An emulator that is not set up is an :class:`~edgesdk.errors.EmulatorError`, as for counts.
"""

from __future__ import annotations

import hashlib
import io
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgesdk.converters.board._guest_count import BOARD_ERROR, BOARD_ERROR_EXIT
from edgesdk.converters.board.emulate import Emulator
from edgesdk.converters.board.userland import CORES, qemu_binary
from edgesdk.errors import BoardRuntimeError, EmulatorError
from edgesdk.files import write_atomic
from edgesdk.runtime.model_file import read_model
from edgesdk.runtime.scheduling import usable_cpus

__all__ = ["BoardOutputs", "board_outputs", "MAX_SAMPLES"]

_GUEST = Path(__file__).with_name("_guest_outputs.py")
_SAMPLE = "edgesdk-sample "
#: Samples a board accuracy is judged on by default: enough to see a drop of a few points, few
#: enough that a 10 MB model under qemu takes minutes, not hours.
MAX_SAMPLES = 64
SAMPLES_PER_WORKER = 8


@dataclass(frozen=True)
class BoardOutputs:
    """The board runtime's first output on each sample, and how it was obtained."""

    cpu: str
    #: Libraries and emulator (part of the cache key).
    runtime: str
    #: Each sample's first output, concatenated in sample order (the layout of
    #: ``Measurement.outputs``).
    outputs: np.ndarray
    samples: int
    #: Processes the samples were split across; wall time (0 when read from the cache).
    workers: int = 1
    seconds: float = 0.0
    cached: bool = False


def board_outputs(
    emulator: Emulator,
    model: str | os.PathLike[str],
    inputs: Mapping[str, np.ndarray],
    cpu: str,
    max_samples: int = MAX_SAMPLES,
    workers: int | None = None,
    timeout_s: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> BoardOutputs:
    """The first output of ``model`` on the first ``max_samples`` rows of ``inputs``, run on
    emulated ``cpu``.

    ``workers`` defaults to this host's usable cores, at most one per ``SAMPLES_PER_WORKER`` (8)
    samples; ``timeout_s`` (default: the emulator's) bounds the time between two finished samples;
    ``progress(done, total)`` is called, in this thread, as samples finish. See the module doc for
    failures and the cache.
    """
    if cpu not in CORES:
        raise EmulatorError(f"no emulated CPU {cpu!r}; use one of {sorted(CORES)}")
    if max_samples < 1:
        raise EmulatorError(
            f"max_samples is {max_samples}; give at least 1 sample to run on the board"
        )
    path = Path(model)
    arrays = {name: np.ascontiguousarray(value[:max_samples]) for name, value in inputs.items()}
    count = len(next(iter(arrays.values())))
    runtime = emulator._runtime(CORES[cpu].arch)  # the string every emulated figure is keyed by
    cached = _cache_file(emulator, read_model(path).sha256, cpu, runtime, arrays)
    if cached.is_file():
        outputs = np.load(cached)
        _check_finite(outputs, path, cpu, runtime)
        return BoardOutputs(cpu, runtime, outputs, count, cached=True)
    if workers is None:  # loading the runtime under qemu costs as much as several small inferences
        workers = min(len(usable_cpus()), count // SAMPLES_PER_WORKER)
    workers = max(1, min(workers, count))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="edgesdk-board-outputs-") as tmp:
        chunks = np.array_split(np.arange(count), workers)
        jobs = []
        for n, rows in enumerate(chunks):
            chunk = {k: v[rows] for k, v in arrays.items()}
            np.savez(Path(tmp) / f"inputs-{n}.npz", **chunk)  # type: ignore[arg-type]
            jobs.append(_command(emulator, cpu, path, Path(tmp), n))
        _run_all(jobs, path, cpu, runtime, timeout_s or emulator.timeout_s, count, progress)
        outputs = np.concatenate([np.load(Path(tmp) / f"outputs-{n}.npy") for n in range(workers)])
    buffer = io.BytesIO()
    np.save(buffer, outputs)
    cached.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(
        cached, buffer.getvalue()
    )  # kept even when not finite: the same run gives the same answer
    _check_finite(outputs, path, cpu, runtime)
    return BoardOutputs(cpu, runtime, outputs, count, workers, time.perf_counter() - started)


def _cache_file(
    emulator: Emulator, sha256: str, cpu: str, runtime: str, inputs: Mapping[str, np.ndarray]
) -> Path:
    """``outputs/`` beside the emulator's counts; a file per model x cpu x runtime x input bytes."""
    digest = hashlib.sha256(runtime.encode())
    for name, value in sorted(inputs.items()):
        digest.update(f"|{name}:{value.dtype}{list(value.shape)}|".encode())
        digest.update(value.tobytes())
    return (
        emulator.counts_dir.with_name("outputs")
        / f"{sha256[:24]}-{cpu}-{digest.hexdigest()[:20]}.npy"
    )


def _command(
    emulator: Emulator, cpu: str, model: Path, work: Path, n: int
) -> tuple[list[str], dict[str, str]]:
    """Chunk ``n``'s guest run: the board's interpreter under ``qemu -cpu`` (no plugin), its env."""
    core = CORES[cpu]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OMP_", "ORT_"))}
    command = [str(qemu_binary(core.arch)), "-cpu", core.qemu_cpu]
    if core.arch == "aarch64":
        userland = emulator.userland
        if userland is None:
            raise EmulatorError("no aarch64 userland: build it with `edgesdk emulator setup`")
        command += [
            "-L",
            str(userland.core_root(cpu)),
            str(userland.root / "usr" / "bin" / userland.python),
        ]
        env["PYTHONPATH"] = "/opt/site"  # found under -L
    else:
        command.append(sys.executable)
    command += [
        str(_GUEST),
        str(model.resolve()),
        str(work / f"inputs-{n}.npz"),
        str(work / f"outputs-{n}.npy"),
    ]
    return command, env


def _run_all(
    jobs: list[tuple[list[str], dict[str, str]]],
    model: Path,
    cpu: str,
    runtime: str,
    timeout_s: float,
    total: int,
    progress: Callable[[int, int], None] | None,
) -> None:
    """Run every chunk at once; a :class:`BoardRuntimeError` for the first that fails."""
    events: queue.Queue[tuple[int, str | None]] = queue.Queue()
    errors: list[list[str]] = [[] for _ in jobs]
    processes, readers = _start(jobs, events, errors)
    done, running = 0, len(processes)
    try:
        while running:
            try:
                n, line = events.get(timeout=timeout_s)
            except queue.Empty:
                raise BoardRuntimeError(
                    f"{model.name} on emulated {cpu} ({runtime}) finished no sample in "
                    f"{timeout_s:.0f} s: it hangs, or give the Emulator a longer timeout_s"
                ) from None
            if line is not None:
                done += 1
                if progress is not None:
                    progress(done, total)
                continue
            running -= 1
            status = processes[n].wait()
            if status != 0:
                raise _failure(model, cpu, runtime, status, errors[n])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        for reader in readers:
            reader.join()  # the pipes reach their end once the process is gone


def _start(
    jobs: list[tuple[list[str], dict[str, str]]],
    events: queue.Queue[tuple[int, str | None]],
    errors: list[list[str]],
) -> tuple[list[subprocess.Popen[str]], list[threading.Thread]]:
    """Start every chunk's process and a reader of its output: ``(n, line)`` per finished sample,
    ``(n, None)`` at its end; its stderr lines are kept in ``errors[n]``."""

    def read(n: int, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None and process.stderr is not None
        with process.stdout as stdout, process.stderr as stderr:
            drain = threading.Thread(target=lambda: errors[n].extend(stderr), daemon=True)
            drain.start()
            for line in stdout:
                if line.startswith(_SAMPLE):
                    events.put((n, line))
            drain.join()
        events.put((n, None))

    processes = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for cmd, env in jobs
    ]
    readers = [threading.Thread(target=read, args=job, daemon=True) for job in enumerate(processes)]
    for reader in readers:
        reader.start()
    return processes, readers


def _failure(
    model: Path, cpu: str, runtime: str, status: int, stderr: list[str]
) -> BoardRuntimeError:
    refused = [line.strip() for line in stderr if line.startswith(BOARD_ERROR)]
    where = f"{model.name} on emulated {cpu} ({runtime})"
    if status == BOARD_ERROR_EXIT and refused:
        return BoardRuntimeError(
            f"{where} fails in the board's runtime: {refused[-1][len(BOARD_ERROR) :]}"
        )
    how = f"signal {-status}" if status < 0 else f"exit {status}"
    tail = " ".join(" ".join(stderr[-4:]).split())[-400:]
    return BoardRuntimeError(
        f"{where} crashed ({how}) computing its outputs{': ' + tail if tail else ''}"
    )


def _check_finite(outputs: np.ndarray, model: Path, cpu: str, runtime: str) -> None:
    """A NaN or an infinity in the board's answer is the variant failing there, not a low score."""
    if np.issubdtype(outputs.dtype, np.floating) and not np.all(np.isfinite(outputs)):
        bad = np.flatnonzero(~np.isfinite(outputs.reshape(len(outputs), -1)).all(axis=1))
        raise BoardRuntimeError(
            f"{model.name} on emulated {cpu} ({runtime}) gives a non-finite output (NaN or "
            f"infinity) on {len(bad)} of {len(outputs)} samples (the first: sample {int(bad[0])})"
        )
