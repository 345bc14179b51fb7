"""Board cost without the board: a variant run by the board's own kernels under qemu-user, its work counted.

The converter runs on an x86 workstation; its users ship to Arm boards, where ONNX Runtime
and LiteRT pick other kernels (int8 activations taken directly, dot-product ``sdot`` on
Cortex-A76, FP16 arithmetic). Scaling this host's timings keeps the host's order of the
variants, which is the wrong order for the board. So each variant is run:

* by the aarch64 wheels of the same onnxruntime / ai-edge-litert versions, in the userland of
  :mod:`.userland`, under ``qemu-aarch64 -cpu <the board's core>`` (qemu sets the HWCAPs of
  that core, so the libraries select exactly the kernels that core gets);
* on one thread, one warm-up, then two windows of ``runs`` inferences between marks the
  guest sets (:mod:`._guest_count`); a TCG plugin (``insn_count.c``, built here with ``cc``)
  counts the guest instructions retired in each window. The count per inference is the
  second window divided by ``runs``; the two windows agree to well under 1% (``spread``).
  Instruction counts are deterministic: no noise, no side-by-side rounds;
* with ONNX Runtime's optimized graph for that architecture saved and read by
  :func:`edgesdk.converters.quantization.qdq.fusion_counts`, so a report can say how many Convs and MatMuls ran as int8
  kernels on the board and how many were left as DequantizeLinear → float → QuantizeLinear.

Results are cached by model SHA-256 × emulated CPU × runtime (library versions, qemu,
plugin) × input shapes, in ``$EDGESDK_EMULATOR_CACHE/counts``: a re-run costs a file read. The board's first
output is kept beside them per input *values*; asked for other values of the same shapes, :meth:`Emulator.first_output`
runs the model again, so that the board's answer compared with this host's is to the same inputs.

:func:`board_latency_ms` turns a count into milliseconds with a per-core cycles-per-
instruction figure (:data:`CYCLES_PER_INSTRUCTION`) and the power mode's clock. The CPIs of the
Cortex-A76, A72 and A55 are fitted on published board latencies
(``benchmarks/converter/data/published_latency.yaml``, by ``benchmarks/converter/calibration.py``, which reports their
error on a held-out half); they scale every variant of a board alike, so the *order* of the
variants, which is what the planner decides on, comes from the counts alone.
The same method applied to this x86 host (``haswell``: AVX2, run by ``qemu-x86_64``) is
checked against real side-by-side timings by ``benchmarks/converter/quantization.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

# CYCLES_PER_INSTRUCTION and PARALLEL_EFFICIENCY are fitted on the fit half of the published board figures and
# shipped with their validated bands (calibration_constants); re-exported here, where counts become milliseconds.
from edgesdk.converters.board.calibration_constants import CYCLES_PER_INSTRUCTION, PARALLEL_EFFICIENCY
from edgesdk.converters.board.guest_process import GuestExit, GuestProcesses, signal_name
from edgesdk.converters.board.userland import CORES, Userland, emulator_cache, find_userland, qemu_binary
from edgesdk.converters.quantization.qdq import FusionCounts, fusion_counts
from edgesdk.errors import BoardRuntimeError, EmulatorError, ModelFormatError
from edgesdk.files import write_atomic
from edgesdk.runtime.model_file import read_model
from edgesdk.runtime.profiles import CoreCluster

__all__ = ["InstructionCount", "Emulator", "CYCLES_PER_INSTRUCTION", "PARALLEL_EFFICIENCY", "emulated_cpu",
           "board_latency_ms"]

_PLUGIN_SOURCE = Path(__file__).with_name("insn_count.c")
_GUEST = Path(__file__).with_name("_guest_count.py")
#: How the guest script (``_guest_count.py``, which imports nothing of edgesdk) reports a model its runtime refused.
_BOARD_ERROR_EXIT, _BOARD_ERROR = 3, "edgesdk-board-error: "
_MARK = re.compile(r"^edgesdk-mark (\d) total=(\d+) simd=(\d+) memory=(\d+)$", re.MULTILINE)

#: The qemu CPU model of each microarchitecture, when a profile's cluster does not name one.
_EMULATED_AS = {"cortex-a53": "cortex-a53", "cortex-a55": "cortex-a55", "cortex-a57": "cortex-a57",
                "cortex-a72": "cortex-a72", "cortex-a73": "cortex-a72", "cortex-a75": "cortex-a76",
                "cortex-a76": "cortex-a76", "cortex-a77": "cortex-a76", "cortex-a78": "neoverse-n1",
                "cortex-a78ae": "neoverse-n1", "neoverse-n1": "neoverse-n1"}


def emulated_cpu(cluster: CoreCluster) -> str | None:
    """The qemu CPU model standing in for ``cluster``'s cores (the profile's ``emulated_cpu``), or None."""
    return cluster.emulated_cpu or _EMULATED_AS.get(cluster.microarchitecture.lower())


@dataclass(frozen=True)
class InstructionCount:
    """Guest instructions one inference of a variant retires on one emulated core, and how they were counted."""

    #: The qemu CPU model (``cortex-a76``, ``haswell``, ...).
    cpu: str
    instructions: float
    #: Of which vector/floating-point data processing, and loads/stores.
    simd: float
    memory: float
    #: Relative difference between the two counted windows (the count's own repeatability).
    spread: float
    runs: int
    #: Libraries and emulator that made the count (part of the cache key).
    runtime: str
    #: What ONNX Runtime's optimizer made of the graph on that architecture (None for TFLite).
    fusion: FusionCounts | None = None
    #: Wall time of the emulated run; 0 when the count came from the cache.
    seconds: float = 0.0
    cached: bool = False

    @property
    def label(self) -> str:
        """How reports name the basis of an estimate made from this count: ``emulated cortex-a76``."""
        return f"emulated {self.cpu}"


def board_latency_ms(count: InstructionCount, microarchitecture: str, mhz: float, threads: int = 1) -> float:
    """Milliseconds on a core of ``microarchitecture`` at ``mhz``, with ``threads`` threads (see the module doc)."""
    cpi = CYCLES_PER_INSTRUCTION.get(microarchitecture.lower(), CYCLES_PER_INSTRUCTION.get(count.cpu, 0.7))
    single = count.instructions * cpi / (mhz * 1e3)
    return single / (1 + PARALLEL_EFFICIENCY * (max(threads, 1) - 1))


class Emulator:
    """Counts a variant's instructions per inference on an emulated core; see the module doc.

    ``Emulator()`` finds the aarch64 userland for this host's runtime versions (or raises
    :class:`EmulatorError` saying how to build it, unless ``require_userland=False``, which
    leaves only the x86 ``haswell`` model usable) and builds the counting plugin if needed.
    Counts are kept in ``counts_dir`` (default: ``counts/`` in the cache). A run that does not
    finish in ``timeout_s`` (default: ``$EDGESDK_EMULATOR_TIMEOUT_S``, else 900 s) is killed
    with its process group, and that variant fails (:class:`BoardRuntimeError`). Counts may run
    on several threads at once.
    """

    def __init__(self, cache: Path | None = None, require_userland: bool = True,
                 timeout_s: float | None = None, counts_dir: Path | None = None) -> None:
        self.cache = cache or emulator_cache()
        self.counts_dir = counts_dir or self.cache / "counts"
        self.timeout_s = timeout_s if timeout_s is not None else _default_timeout()
        self.userland: Userland | None = None
        try:
            self.userland = find_userland(self.cache)
        except EmulatorError:
            if require_userland:
                raise
        self.plugin = _plugin(self.cache)
        self.guests = GuestProcesses()
        # One lock per count key: two threads counting the same model on the same core run it once,
        # the second reads the first's cached count (the file is written atomically, safe across
        # processes).
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    def count(self, model: str | os.PathLike[str], inputs: Mapping[str, np.ndarray], cpu: str,
              runs: int = 1) -> InstructionCount:
        """Instructions per inference of ``model`` on ``inputs`` (one batch, as the model takes it) on ``cpu``."""
        if cpu not in CORES:
            raise EmulatorError(f"no emulated CPU {cpu!r}; use one of {sorted(CORES)}")
        path = Path(model)
        core = CORES[cpu]
        runtime = self._runtime(core.arch)
        arrays = {name: np.ascontiguousarray(value) for name, value in inputs.items()}
        key = self._key(_checked(path), cpu, runtime, arrays)
        cached = self.counts_dir / f"{key}.json"
        output = _output_file(cached, arrays)
        with self._lock(key):
            # a count is per shapes; first_output runs again for other values' output
            if cached.is_file():
                data = json.loads(cached.read_text())
                fusion = FusionCounts(**data.pop("fusion")) if data.get("fusion") else None
                return InstructionCount(**{**data, "fusion": fusion, "seconds": 0.0,
                                           "cached": True})
            cached.parent.mkdir(parents=True, exist_ok=True)
            count = self._run(path, arrays, cpu, runs, runtime, output)
            kept = {k: v for k, v in asdict(count).items() if k != "cached"}
            write_atomic(cached, json.dumps(kept).encode())
        return count

    def abort(self) -> int:
        """Kill every count of this emulator still running (they raise :class:`EmulatorError`);
        returns how many."""
        return self.guests.abort()

    def _lock(self, key: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault(key, threading.Lock())

    def first_output(self, model: str | os.PathLike[str], inputs: Mapping[str, np.ndarray],
                     cpu: str) -> np.ndarray | None:
        """The board runtime's first output on ``inputs`` on ``cpu``: kept from the run that counted ``model`` with these
        very input values, else from a run made now (the count was cached for other values of the same shapes)."""
        arrays = {name: np.ascontiguousarray(value) for name, value in inputs.items()}
        runtime = self._runtime(CORES[cpu].arch)
        key = self._key(_checked(Path(model)), cpu, runtime, arrays)
        saved = _output_file(self.counts_dir / f"{key}.json", arrays)
        if not saved.is_file():
            saved.parent.mkdir(parents=True, exist_ok=True)
            self._run(Path(model), arrays, cpu, 1, runtime, saved)
        return np.load(saved) if saved.is_file() else None

    def _runtime(self, arch: str) -> str:
        qemu = qemu_binary(arch)
        version = _qemu_version(qemu)
        plugin = self.plugin.parent.name
        if arch == "x86_64":
            import onnxruntime

            return f"onnxruntime {onnxruntime.__version__} (this host's, python{sys.version_info[0]}.{sys.version_info[1]}); " \
                   f"qemu {version}; {plugin}"
        if self.userland is None:
            raise EmulatorError("no aarch64 userland: build it with `edgesdk emulator setup`")
        return f"{self.userland.runtime}; qemu {version}; {plugin}"

    @staticmethod
    def _key(sha256: str, cpu: str, runtime: str, inputs: Mapping[str, np.ndarray]) -> str:
        shapes = ";".join(f"{name}:{value.dtype}{list(value.shape)}" for name, value in sorted(inputs.items()))
        digest = hashlib.sha256(f"{runtime}|{shapes}".encode()).hexdigest()[:16]
        return f"{sha256[:24]}-{cpu}-{digest}"

    def _run(self, model: Path, inputs: Mapping[str, np.ndarray], cpu: str, runs: int,
             runtime: str, output_to: Path) -> InstructionCount:
        core = CORES[cpu]
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="edgesdk-emulate-") as tmp:
            work = Path(tmp)
            np.savez(work / "inputs.npz", **dict(inputs))  # type: ignore[arg-type]  # numpy types **kwds as bool
            log = work / "plugin.log"
            optimized = work / "optimized.onnx" if model.suffix == ".onnx" else None
            command = [str(qemu_binary(core.arch)), "-cpu", core.qemu_cpu, "-plugin", str(self.plugin), "-d", "plugin",
                       "-D", str(log)]
            env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OMP_", "ORT_"))}
            env["EDGESDK_GUEST_OUTPUTS"] = str(work / "first_output.npy")
            if core.arch == "aarch64":
                assert self.userland is not None  # _runtime checked
                command += ["-L", str(self.userland.core_root(cpu)), str(self.userland.root / "usr" / "bin" /
                                                                        self.userland.python)]
                env["PYTHONPATH"] = "/opt/site"  # found under -L
            else:
                command.append(sys.executable)
            command += [str(_GUEST), str(model.resolve()), str(work / "inputs.npz"), str(runs)]
            if optimized is not None:
                command.append(str(optimized))
            # in work: a crash's core file stays there
            done = self.guests.run(command, env, self.timeout_s, cwd=work)
            marks = {int(m[0]): tuple(int(v) for v in m[1:]) for m in _MARK.findall(log.read_text())} \
                if log.exists() else {}
            _check_exit(done, model.name, cpu, runtime, len(marks), self.timeout_s)
            fusion = fusion_counts(optimized) if optimized is not None and optimized.exists() else None
            if (work / "first_output.npy").is_file():  # kept beside the count, for the output check before a bundle
                write_atomic(output_to, (work / "first_output.npy").read_bytes())
        first = [b - a for a, b in zip(marks[0], marks[1])]
        second = [b - a for a, b in zip(marks[1], marks[2])]
        total, simd, memory = (v / runs for v in second)
        return InstructionCount(cpu, total, simd, memory, abs(second[0] - first[0]) / max(second[0], 1), runs,
                                runtime, fusion, time.perf_counter() - started)


def _default_timeout() -> float:
    """``$EDGESDK_EMULATOR_TIMEOUT_S`` (seconds a count may run), else 900."""
    text = os.environ.get("EDGESDK_EMULATOR_TIMEOUT_S", "").strip()
    if not text:
        return 900.0
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise EmulatorError(f"EDGESDK_EMULATOR_TIMEOUT_S={text!r}: give the seconds a count may "
                            "run, a number over 0 (default 900), or unset it")
    return value


def _check_exit(done: GuestExit, name: str, cpu: str, runtime: str, marks: int,
                timeout_s: float) -> None:
    """Raise why a guest run gave no count: :class:`BoardRuntimeError` for what the variant did on
    the board (its runtime refused it, crashed, hung, exited or stopped before its counted runs
    ended): that variant alone is vetoed; :class:`EmulatorError` when the run was ended from here
    (:meth:`Emulator.abort`)."""
    where = "before its counted runs" if marks == 0 else f"in its counted runs ({marks} of 3 marks)"
    # qemu's own "uncaught target signal" line says again what the return code says
    said_lines = [ln.strip() for ln in done.stderr.strip().splitlines() if ln.strip()
                  and not ln.startswith("qemu: uncaught target signal")]
    tail = " | ".join(said_lines[-3:])
    said = f": {tail}" if tail else ""
    if done.aborted:
        raise EmulatorError(f"the count of {name} on emulated {cpu} was stopped: emulation was "
                            "turned off")
    if done.timed_out:
        raise BoardRuntimeError(f"{name} did not finish in {timeout_s:.0f} s on the emulated "
                                f"{cpu}, stopped {where}: it loops or hangs in the board's "
                                "runtime, or needs longer (EDGESDK_EMULATOR_TIMEOUT_S)")
    refused = [line for line in done.stderr.splitlines() if line.startswith(_BOARD_ERROR)]
    if done.returncode == _BOARD_ERROR_EXIT and refused:
        raise BoardRuntimeError(f"{name} fails in the board's runtime on emulated {cpu} "
                                f"({runtime}): {refused[-1][len(_BOARD_ERROR):]}")
    if done.returncode < 0:
        raise BoardRuntimeError(f"{name} crashed on the emulated {cpu} "
                                f"({signal_name(done.returncode)}) {where}{said}")
    if done.returncode != 0:
        raise BoardRuntimeError(f"{name} exited with status {done.returncode} on the emulated "
                                f"{cpu} {where} ({runtime}){said}")
    if marks != 3:
        raise BoardRuntimeError(f"{name} ended on the emulated {cpu} with {marks} of 3 marks: its "
                                f"counted runs did not complete ({runtime}){said}")


def _output_file(count: Path, inputs: Mapping[str, np.ndarray]) -> Path:
    """Where the board's first output is kept beside ``count``: per input *values*, as a count is per shapes (an
    output kept for other values of the same shapes would be compared with this host's answer to these)."""
    digest = hashlib.sha256()
    for name, value in sorted(inputs.items()):
        digest.update(f"{name}:{value.dtype}{list(value.shape)}".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    return count.with_name(f"{count.stem}-{digest.hexdigest()[:16]}.npy")


def _checked(path: Path) -> str:
    """The model's SHA-256, once its bytes are known to parse (a corrupt file is a ModelFormatError, not a guest crash)."""
    model = read_model(path)
    if model.format.value == "onnx":
        import onnx

        try:
            onnx.load_from_string(model.content)
        except Exception as exc:  # protobuf's DecodeError and friends
            raise ModelFormatError(f"{path}: not an ONNX model ({type(exc).__name__}: {exc}); export it again") \
                from exc
    return model.sha256


def _qemu_version(qemu: Path) -> str:
    out = subprocess.run([str(qemu), "--version"], capture_output=True, text=True, check=False).stdout
    found = re.search(r"version (\S+)", out)
    if found is None:
        raise EmulatorError(f"{qemu} --version printed no version: {out[:200]!r}")
    if int(found.group(1).split(".")[0]) >= 9:
        raise EmulatorError(f"{qemu} is qemu {found.group(1)}; edgesdk's counting plugin speaks plugin API 1, which "
                            "qemu 4.2-8.x load (Debian bookworm's qemu-user 7.2 does)")
    return found.group(1)


def _plugin(cache: Path) -> Path:
    """The counting plugin, built from ``insn_count.c`` once per source version."""
    source = _PLUGIN_SOURCE.read_bytes()
    target = cache / f"plugin-{hashlib.sha256(source).hexdigest()[:12]}" / "libinsn.so"
    if target.exists():
        return target
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise EmulatorError("no C compiler (cc) to build the instruction-counting plugin; install gcc")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / "libinsn.so"
        done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-fvisibility=hidden", str(_PLUGIN_SOURCE), "-o",
                               str(built)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise EmulatorError(f"building the counting plugin failed: {done.stderr.strip()[-500:]}")
        os.replace(built, target)
    return target
