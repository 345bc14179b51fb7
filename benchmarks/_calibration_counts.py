"""Instruction counts of the calibration's CPU figures, by the converter's own :class:`Emulator`.

Each (model, input, emulated core) is counted once, on one thread, by the board's aarch64
ONNX Runtime under qemu-user; the Emulator caches counts in ``$EDGESDK_EMULATOR_CACHE/counts``.

**The Cortex-A55.** qemu-user 7.2 (Debian bookworm) lists no Cortex-A55 (``qemu-aarch64 -cpu help``:
a64fx, cortex-a35, cortex-a53, cortex-a57, cortex-a72, cortex-a76, max, neoverse-n1), and the
converter counts A55 clusters on ``cortex-a53`` (Armv8.0: no dot product, no FP16 arithmetic),
so ONNX Runtime runs its int8 kernels without ``sdot``/``udot`` there, which the A55 has. Here
the A55 is counted on :data:`A55`: qemu's ``cortex-a76`` model, whose ID registers give exactly
the Armv8.2-A extensions the A55 implements (DotProd, FP16, RDM, LRCPC, DCPoP, atomics), behind a
``/proc/cpuinfo`` and sysfs that say ``CPU part 0xd05`` (Cortex-A55) with the A55's ``Features``
line, and each core's ``regs/identification/midr_el1`` set to an A55's (0x412fd050). ONNX Runtime's MLAS
picks kernels from the HWCAPs (``HasArmNeonDot``: the ``sdot``/``udot`` int8 GEMMs and convolutions) and,
for its signed int8 kernels, from the current core's microarchitecture (``IsCurrentCoreArmv8NarrowLd``:
the "Little" variants for the A53/A55's 64-bit load path), which it reads from that part number. So the
kernels chosen, and the instructions counted, are the ones an RK3588's A55 runs; how many cycles they
take on the in-order core is the CPI's business (fitted in ``calibration.py``). qemu models no timing,
so nothing of the A76's out-of-order pipeline leaks into a count.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
from _calibration_models import build  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

from edgesdk.converters.emulate import Emulator, InstructionCount
from edgesdk.converters.userland import CORES, EmulatedCore

__all__ = ["A55", "counter", "count_figure"]

_A55_FEATURES = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop "
                 "asimddp")
#: The Cortex-A55 stand-in: qemu's cortex-a76 ISA (the A55's Armv8.2-A extensions) behind an A55's cpuinfo.
A55 = EmulatedCore("cortex-a76", "aarch64", "0xd05", _A55_FEATURES)
#: The emulated CPU each figure's core is counted on (the A55 on the stand-in above, not cortex-a53).
COUNTED_ON = {"cortex-a72": "cortex-a72", "cortex-a76": "cortex-a76", "cortex-a55": "cortex-a55"}


def counter() -> Emulator:
    """The project's Emulator, with the ``cortex-a55`` stand-in registered and its core tree written."""
    from edgesdk.converters.userland import _core_tree  # the tree writer `edgesdk emulator setup` uses

    CORES.setdefault("cortex-a55", A55)
    emulator = Emulator()
    assert emulator.userland is not None  # Emulator() raises without one
    tree = emulator.userland.path / "cores" / "cortex-a55"
    if not tree.is_dir():
        _core_tree(tree, A55)
        for cpu in (tree / "sys" / "devices" / "system" / "cpu").glob("cpu[0-9]*"):
            (cpu / "regs" / "identification").mkdir(parents=True, exist_ok=True)
            (cpu / "regs" / "identification" / "midr_el1").write_text("0x00000000412fd050\n")
    return emulator


def count_figure(emulator: Emulator, figure: dict, cached_only: bool = False) -> InstructionCount | None:
    """Instructions per inference of ``figure``'s model on its core (None when ``cached_only`` and not counted)."""
    model = build(figure["model"], figure["input"], figure.get("classes"))
    cpu = COUNTED_ON[figure["core"]]
    inputs = {"images": np.zeros((1, 3, figure["input"], figure["input"]), np.float32)}
    if cached_only and not _is_cached(emulator, model, cpu, inputs):
        return None
    return emulator.count(model, inputs, cpu)


def _is_cached(emulator: Emulator, model: Path, cpu: str, inputs: dict[str, np.ndarray]) -> bool:
    from edgesdk.converters.emulate import _checked

    key = emulator._key(_checked(model), cpu, emulator._runtime(CORES[cpu].arch), inputs)
    return (emulator.counts_dir / f"{key}.json").is_file()


def pending(emulator: Emulator, figures: Iterable[dict]) -> list[tuple[str, int, str]]:
    """The distinct (model, input, cpu) of ``figures`` not counted yet."""
    todo = []
    for f in figures:
        item = (f["model"], f["input"], COUNTED_ON[f["core"]])
        if item not in todo and count_figure(emulator, f, cached_only=True) is None:
            todo.append(item)
    return todo
