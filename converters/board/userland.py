"""The emulated aarch64 userland the converter runs variants in, with the board's own wheels.

Built once per user and runtime versions, in ``$EDGESDK_EMULATOR_CACHE`` (default
``~/.cache/edgesdk/emulator``), in about half a minute, without debootstrap:

1. Debian's arm64 packages for the interpreter and the C/C++ runtime (``python3.X-minimal``,
   ``libpython3.X-stdlib``, ``libc6``, ``libstdc++6`` and the few libraries they load) are
   fetched with ``apt-get download`` and unpacked with ``dpkg-deb -x``. This needs the arm64
   architecture in apt's lists: as root, ``dpkg --add-architecture arm64 && apt-get update``
   (``scripts/setup.sh`` does it, and installs ``qemu-user``).
2. The aarch64 wheels of the numpy, onnxruntime and ai-edge-litert versions installed on this
   host are fetched with ``pip download --platform`` and installed with ``pip install --target``,
   so a variant runs under emulation with the same library versions the converter uses here.
3. One small tree per emulated core (``cores/<cpu>/``): links to the shared root, and a
   ``/proc/cpuinfo`` and ``/sys/devices/system/cpu`` written for that core (its ``CPU part`` and
   ``Features``). ``qemu-aarch64 -L`` looks up absolute paths there first, so onnxruntime's CPU
   detection (pytorch/cpuinfo) reads an Arm core, not this host's x86 sysfs, which crashes it.
   Instruction-set features themselves (dot product, FP16) come from ``qemu -cpu``'s HWCAPs.

The tree is built in a temporary directory beside its final place and renamed into place when
complete, so a half-built userland is never used.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from edgesdk.errors import EmulatorError

__all__ = ["CORES", "EmulatedCore", "Userland", "build_userland", "find_userland", "emulator_cache", "qemu_binary"]


@dataclass(frozen=True)
class EmulatedCore:
    """A CPU model of ``qemu-user`` and what Linux shows for it."""

    #: ``-cpu`` of qemu-aarch64 / qemu-x86_64.
    qemu_cpu: str
    arch: str
    #: ``CPU part`` of /proc/cpuinfo (Arm only).
    cpu_part: str | None = None
    #: The ``Features`` line Linux prints for it (Arm only).
    features: str = ""
    #: ``CPU variant`` (the r of rNpM): ONNX Runtime picks its int8 kernels by part and variant (an A55 r0p0 gets
    #: no dot-product kernels, an r2p0 does), so a stand-in must show the board's.
    variant: int = 0


_A76_FEATURES = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop "
                 "asimddp")
#: The cores qemu-user 7.2 emulates that the shipped profiles map to (``emulated_cpu`` in a profile's
#: cluster). qemu 7.2 has no Cortex-A55 or A78 model. An A55 is counted on qemu's cortex-a76 ISA (the
#: A55's Armv8.2-A extensions, dot product included) behind an A55 r2p0's cpuinfo and MIDR, so ONNX
#: Runtime picks the kernels it picks on the board: counted on cortex-a53, MobileNetV2 int8 took 4.1x
#: the instructions (no sdot/udot; benchmarks/converter/calibration_counts.py). The in-order pipeline is the
#: A55's CPI's business (fitted in benchmarks/converter/calibration.py). A78AE clusters use neoverse-n1.
CORES = {
    "cortex-a53": EmulatedCore("cortex-a53", "aarch64", "0xd03", "fp asimd evtstrm crc32 cpuid"),
    "cortex-a55": EmulatedCore("cortex-a76", "aarch64", "0xd05", _A76_FEATURES, variant=2),
    "cortex-a57": EmulatedCore("cortex-a57", "aarch64", "0xd07", "fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid"),
    "cortex-a72": EmulatedCore("cortex-a72", "aarch64", "0xd08", "fp asimd evtstrm crc32 cpuid"),
    "cortex-a76": EmulatedCore("cortex-a76", "aarch64", "0xd0b", _A76_FEATURES),
    "neoverse-n1": EmulatedCore("neoverse-n1", "aarch64", "0xd0c", _A76_FEATURES + " ssbs"),
    # This host's own ISA, for checking the method against real timings (AVX2 + FMA, no AVX-512:
    # qemu's TCG has no AVX-512).
    "haswell": EmulatedCore("Haswell-noTSX", "x86_64"),
}
_SYSFS_CORES = 64  # cores written into each tree: sched_getcpu() under qemu-user returns the host's cpu number
_DEBS = ("libc6", "libgcc-s1", "libstdc++6", "zlib1g", "libexpat1", "libffi8", "libbz2-1.0", "liblzma5",
         "libssl3", "libuuid1", "libcrypt1", "libsqlite3-0")
_WHEELS = ("numpy", "onnxruntime", "ai-edge-litert")
_ENABLE = ("as root: apt-get install -y qemu-user && dpkg --add-architecture arm64 && apt-get update; then: "
           "edgesdk emulator setup")


def emulator_cache() -> Path:
    """Where userlands, the plugin and counted results are kept."""
    return Path(os.environ.get("EDGESDK_EMULATOR_CACHE", Path.home() / ".cache" / "edgesdk" / "emulator"))


def qemu_binary(arch: str) -> Path:
    """``qemu-aarch64`` or ``qemu-x86_64`` (the dynamic build: the static one has no plugin support)."""
    found = shutil.which(f"qemu-{arch}")
    if found is None:
        raise EmulatorError(f"qemu-{arch} is not installed; board estimates need qemu-user ({_ENABLE})")
    return Path(found)


def _runtime_versions() -> dict[str, str]:
    versions = {}
    for name in _WHEELS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            if name != "ai-edge-litert":  # LiteRT is optional on the host; ONNX variants still count
                raise EmulatorError(f"{name} is not installed on this host; install edgesdk's base dependencies") \
                    from None
    return versions


def _key(versions: dict[str, str]) -> str:
    return "aarch64-" + "-".join(f"{name}{versions[name]}" for name in sorted(versions))


@dataclass(frozen=True)
class Userland:
    """A built aarch64 userland: its root, its interpreter and the library versions in it."""

    path: Path
    python: str
    versions: dict[str, str]

    @property
    def root(self) -> Path:
        """The unpacked packages and ``opt/site`` (the wheels)."""
        return self.path / "root"

    def core_root(self, cpu: str) -> Path:
        """The ``qemu -L`` prefix for ``cpu``: the shared root plus that core's /proc/cpuinfo and sysfs."""
        tree = self.path / "cores" / cpu
        if not tree.is_dir() and cpu in CORES:  # a core added after this userland was built: its tree is small
            staging = tree.with_name(f".{cpu}.{os.getpid()}")
            shutil.rmtree(staging, ignore_errors=True)
            _core_tree(staging, CORES[cpu])
            try:
                os.replace(staging, tree)
            except OSError:  # another process wrote it first
                shutil.rmtree(staging, ignore_errors=True)
        if not tree.is_dir():
            raise EmulatorError(f"the userland at {self.path} has no tree for {cpu!r}; it has "
                                f"{sorted(p.name for p in (self.path / 'cores').iterdir())}; rebuild it with "
                                "`edgesdk emulator setup --force`")
        return tree

    @property
    def runtime(self) -> str:
        """E.g. ``onnxruntime 1.32.0, ai-edge-litert 2.3.0 (aarch64 wheels, python3.11)``: part of every cache key."""
        libs = ", ".join(f"{name} {version}" for name, version in sorted(self.versions.items()) if name != "numpy")
        return f"{libs} (aarch64 wheels, {self.python})"


def find_userland(cache: Path | None = None) -> Userland:
    """The userland matching this host's runtime versions; :class:`EmulatorError` saying how to build it if none."""
    versions = _runtime_versions()
    path = (cache or emulator_cache()) / _key(versions)
    stamp = path / "userland.json"
    if not stamp.is_file():
        raise EmulatorError(f"no aarch64 userland for {_key(versions)} in {path.parent} ({_ENABLE})")
    data = json.loads(stamp.read_text())
    return Userland(path, data["python"], data["versions"])


def build_userland(cache: Path | None = None, force: bool = False,
                   log: Callable[[str], None] = print) -> Userland:
    """Build (or find) the userland for this host's runtime versions; see the module doc."""
    qemu_binary("aarch64")
    if not force:
        try:
            return find_userland(cache)
        except EmulatorError:
            pass
    versions = _runtime_versions()
    final = (cache or emulator_cache()) / _key(versions)
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{final.name}.") as tmp:
        work = Path(tmp)
        root = work / "root"
        python = _unpack_debs(work / "debs", root, log)
        _install_wheels(work / "wheels", root / "opt" / "site", versions, python, log)
        for name, core in CORES.items():
            if core.arch == "aarch64":
                _core_tree(work / "cores" / name, core)
        (work / "userland.json").write_text(json.dumps({"python": python, "versions": versions}, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(work, final)
        work.mkdir()  # TemporaryDirectory removes it again on exit
    log(f"aarch64 userland ready: {final}")
    return find_userland(cache)


def _run(command: list[str], what: str, cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise EmulatorError(f"{what}: {command[0]} is not installed ({_ENABLE})") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise EmulatorError(f"{what} failed (exit {done.returncode}): {tail}")
    return done.stdout


def _guest_python() -> str:
    """``python3.X`` of Debian's arm64 ``python3-minimal`` (3.11 on bookworm)."""
    if "arm64" not in _run(["dpkg", "--print-foreign-architectures"], "reading apt's architectures").split():
        raise EmulatorError(f"apt has no arm64 packages listed, which the aarch64 userland is made from ({_ENABLE})")
    shown = _run(["apt-cache", "show", "python3-minimal:arm64"], "looking up Debian's arm64 python3-minimal")
    found = re.search(r"^(?:Pre-)?Depends:.*?\b(python3\.\d+)-minimal", shown, re.MULTILINE)
    if found is None:
        raise EmulatorError("Debian's python3-minimal:arm64 names no python3.X-minimal; run apt-get update as root")
    return found.group(1)


def _unpack_debs(debs: Path, root: Path, log: Callable[[str], None]) -> str:
    python = _guest_python()
    packages = (*_DEBS, f"{python}-minimal", f"lib{python}-minimal", f"lib{python}-stdlib")
    debs.mkdir(parents=True)
    log(f"fetching {len(packages)} Debian arm64 packages ({python}, libc, libstdc++)")
    _run(["apt-get", "download", *(f"{p}:arm64" for p in packages)], "apt-get download", cwd=debs)
    root.mkdir()
    for deb in sorted(debs.glob("*.deb")):
        _run(["dpkg-deb", "-x", str(deb), str(root)], f"unpacking {deb.name}")
    shutil.rmtree(debs)
    if not (root / "usr" / "bin" / python).exists():
        raise EmulatorError(f"the arm64 packages did not provide /usr/bin/{python}")
    return python


def _install_wheels(wheels: Path, site: Path, versions: dict[str, str], python: str,
                    log: Callable[[str], None]) -> None:
    digits = python.removeprefix("python").replace(".", "")
    platforms = ["manylinux2014_aarch64", *(f"manylinux_2_{v}_aarch64" for v in (17, 24, 26, 27, 28, 31, 34, 35, 36))]
    target = [f"--platform={p}" for p in platforms] + [
        f"--python-version={python.removeprefix('python')}", "--implementation=cp", f"--abi=cp{digits}", "--abi=abi3",
        "--abi=none", "--only-binary=:all:"]
    pins = [f"{name}=={version}" for name, version in sorted(versions.items())]
    log(f"fetching aarch64 wheels: {' '.join(pins)}")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    _run([*pip, "download", *target, "-d", str(wheels), *pins], "pip download (aarch64 wheels)")
    _run([*pip, "install", *target, "--no-deps", "--no-index", "--target", str(site),
          *map(str, sorted(wheels.glob("*.whl")))], "pip install --target (aarch64 wheels)")
    shutil.rmtree(wheels)


def _core_tree(tree: Path, core: EmulatedCore) -> None:
    """Links to the shared root, and this core's /proc/cpuinfo and /sys/devices/system/cpu."""
    tree.mkdir(parents=True)
    for name in ("usr", "lib", "etc", "opt"):
        (tree / name).symlink_to(Path("..", "..", "root", name))
    (tree / "proc").mkdir()
    entry = ("processor\t: {n}\nBogoMIPS\t: 108.00\nFeatures\t: " + core.features + "\nCPU implementer\t: 0x41\n"
             f"CPU architecture: 8\nCPU variant\t: {core.variant:#x}\nCPU part\t: " + str(core.cpu_part) +
             "\nCPU revision\t: 0\n\n")
    (tree / "proc" / "cpuinfo").write_text("".join(entry.format(n=n) for n in range(_SYSFS_CORES)))
    cpus = tree / "sys" / "devices" / "system" / "cpu"
    cpus.mkdir(parents=True)
    for name in ("possible", "present", "online"):
        (cpus / name).write_text(f"0-{_SYSFS_CORES - 1}\n")
    for n in range(_SYSFS_CORES):
        (cpus / f"cpu{n}" / "cpufreq").mkdir(parents=True)
        (cpus / f"cpu{n}" / "cpufreq" / "cpuinfo_max_freq").write_text("2000000\n")
        (cpus / f"cpu{n}" / "cpu_capacity").write_text("1024\n")
        if core.cpu_part is not None:  # MIDR_EL1: implementer 0x41 (Arm), variant, architecture 0xf, part, revision 0
            midr = 0x41 << 24 | core.variant << 20 | 0xF << 16 | int(core.cpu_part, 16) << 4
            (cpus / f"cpu{n}" / "regs" / "identification").mkdir(parents=True)
            (cpus / f"cpu{n}" / "regs" / "identification" / "midr_el1").write_text(f"{midr:#018x}\n")
