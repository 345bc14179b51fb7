"""Instruction counts of the calibration's CPU figures, by the converter's own :class:`Emulator`.

Each (model, input, emulated core) is counted once, on one thread, by the board's aarch64
ONNX Runtime under qemu-user; the Emulator caches counts in ``$EDGESDK_EMULATOR_CACHE/counts``.

**The Cortex-A55.** qemu-user 7.2 (Debian bookworm) lists no Cortex-A55 (``qemu-aarch64 -cpu help``:
a64fx, cortex-a35, cortex-a53, cortex-a57, cortex-a72, cortex-a76, max, neoverse-n1), and the
converter counted A55 clusters on ``cortex-a53`` (Armv8.0: no dot product, no FP16 arithmetic).
The A55 is now counted on :data:`A55` (``cortex-a55``): qemu's ``cortex-a76`` model, whose ID
registers and HWCAPs give the Armv8.2-A extensions the A55 implements (DotProd, FP16, RDM, LRCPC,
DCPoP, atomics), behind a ``/proc/cpuinfo`` that says what Linux says on A55 boards: ``CPU part
0xd05``, ``CPU variant 0x2`` (r2p0), the A55's ``Features`` line, and ``midr_el1`` 0x412fd050 in
sysfs. qemu models no timing, so nothing of the A76's out-of-order pipeline leaks into a count;
only the instruction stream is counted, and ONNX Runtime picks that stream from the HWCAPs and
the MIDR (through pytorch/cpuinfo). Measured here on MobileNetV2 int8 (dynamic) at 224:

=====================================  ================
counted on                              instructions
=====================================  ================
``cortex-a53`` (the converter before)   929.6 M
stand-in, part 0xd05 r0p0               930.0 M
stand-in, part 0xd05 r2p0 (:data:`A55`)  226.8 M
``cortex-a76``                          226.8 M
=====================================  ================

so ONNX Runtime 1.32 runs its ``sdot``/``udot`` int8 kernels on an A55 r2p0 and not on r0p0 (which
pytorch/cpuinfo treats as lacking dot product), and counting an A55 as an A53 overstates its int8
work about 4x. FP32 models run the same kernels on all of these (MobileNetV2: 180.7 M on
``cortex-a53``, 181.2 M on the stand-in). How many cycles the A55's in-order pipeline takes per
instruction is the CPI's business (fitted in ``calibration.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from benchmarks.converter.calibration_models import build
from edgesdk.converters.board.emulate import Emulator, InstructionCount
from edgesdk.converters.board.userland import CORES

__all__ = ["A55", "counter", "count_figure"]

#: The Cortex-A55 stand-in is the converter's own now (``CORES["cortex-a55"]``): qemu's cortex-a76 ISA behind an
#: A55 r2p0's cpuinfo and MIDR (edgesdk.converters.board.userland).
A55 = CORES["cortex-a55"]
#: The emulated CPU each figure's core is counted on.
COUNTED_ON = {"cortex-a72": "cortex-a72", "cortex-a76": "cortex-a76", "cortex-a55": "cortex-a55"}


def counter() -> Emulator:
    """The project's Emulator (its userland writes the A55 stand-in's core tree on first use)."""
    emulator = Emulator()
    assert emulator.userland is not None  # Emulator() raises without one
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
    from edgesdk.converters.board.emulate import _checked

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
