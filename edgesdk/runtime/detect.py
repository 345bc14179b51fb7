"""Detect the board this process runs on from /proc and /sys.

Everything is read below a ``root`` directory (``/`` on a real device) so tests can feed
trees recorded from real boards. Nothing here assumes x86: the architecture comes from
/proc/cpuinfo, clusters from ``CPU part``, ``cpu_capacity`` and ``cpuinfo_max_freq``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from edgesdk.errors import ProfileError
from edgesdk.runtime.profiles import CoreCluster, DeviceProfile, PowerMode, RuntimeMode, list_profiles

__all__ = ["CpuCore", "Topology", "Detection", "read_topology", "detect", "detect_device"]

log = logging.getLogger(__name__)

#: Arm CPU part ids (implementer 0x41) to core names, from Arm's technical reference manuals.
ARM_PARTS = {
    "0xd03": "cortex-a53",
    "0xd04": "cortex-a35",
    "0xd05": "cortex-a55",
    "0xd07": "cortex-a57",
    "0xd08": "cortex-a72",
    "0xd09": "cortex-a73",
    "0xd0a": "cortex-a75",
    "0xd0b": "cortex-a76",
    "0xd0d": "cortex-a77",
    "0xd41": "cortex-a78",
    "0xd42": "cortex-a78ae",
    "0xd44": "cortex-x1",
    "0xd46": "cortex-a510",
    "0xd47": "cortex-a710",
    "0xd4b": "cortex-a78c",
    "0xd80": "cortex-a520",
    "0xd81": "cortex-a720",
}

#: Used when the kernel exposes no cpufreq (VMs, some x86 hosts) and cpuinfo has no MHz.
UNKNOWN_MHZ = 1000
#: The shipped profiles' budget rule: 25% of RAM, at most this much.
MAX_MODEL_BUDGET_MB = 2048


@dataclass(frozen=True)
class CpuCore:
    """One logical CPU as the kernel describes it."""

    id: int
    #: ``CPU part`` from /proc/cpuinfo, lower case (``0xd0b``); None on x86.
    part: str | None
    #: Known name of the part (``cortex-a76``), ``arm-part-0x...`` when unknown, the model name on x86.
    microarchitecture: str
    #: From cpufreq, else cpuinfo's ``cpu MHz``, else UNKNOWN_MHZ.
    max_mhz: int
    #: ``cpu_capacity`` from sysfs (1024 = fastest); None where the kernel does not expose it.
    capacity: int | None


@dataclass(frozen=True)
class Topology:
    """The live hardware, as read from /proc and /sys."""

    arch: str
    #: /proc/device-tree/model, else cpuinfo's ``Model`` line; None when neither exists (x86).
    model: str | None
    #: /proc/device-tree/compatible entries; empty without a device tree.
    compatible: tuple[str, ...]
    cpus: tuple[CpuCore, ...]
    #: The cpus grouped by part, capacity and max frequency.
    clusters: tuple[CoreCluster, ...]
    #: MemTotal in MiB; None when /proc/meminfo is unreadable.
    mem_total_mb: int | None


@dataclass(frozen=True)
class Detection:
    """The topology, the profile chosen for it, and why that profile."""

    topology: Topology
    profile: DeviceProfile
    #: Which hint matched, or that a generic profile was built, for people to read.
    reason: str


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _cpuinfo_blocks(text: str) -> tuple[list[dict[str, str]], dict[str, str]]:
    """Split /proc/cpuinfo into per-processor blocks and trailing global lines."""
    blocks: list[dict[str, str]] = []
    trailer: dict[str, str] = {}
    for chunk in re.split(r"\n\s*\n", text.strip()):
        fields: dict[str, str] = {}
        for line in chunk.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip().lower()] = value.strip()
        if "processor" in fields and fields["processor"].isdigit():
            blocks.append(fields)
        else:
            trailer.update(fields)
    return blocks, trailer


def _arch(blocks: list[dict[str, str]]) -> str:
    first = blocks[0] if blocks else {}
    if "cpu implementer" in first:
        return "aarch64" if first.get("cpu architecture", "8") in ("8", "9", "AArch64") else "armv7l"
    if "vendor_id" in first or "flags" in first:
        return "x86_64" if " lm " in f" {first.get('flags', '')} " else "i686"
    return "unknown"


def _int_file(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text.strip()) if text else None
    except ValueError:
        return None


def _group_clusters(cpus: list[CpuCore]) -> tuple[CoreCluster, ...]:
    """Group cores of the same part, capacity and max frequency; name them by speed."""
    groups: dict[tuple[str | None, int, int], list[CpuCore]] = {}
    for cpu in cpus:
        capacity = cpu.capacity if cpu.capacity is not None else 1024
        groups.setdefault((cpu.part, capacity, cpu.max_mhz), []).append(cpu)
    ordered = sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[1][0].id))
    names = {1: ["cpu"], 2: ["little", "big"], 3: ["little", "mid", "big"]}.get(
        len(ordered), [f"cluster{i}" for i in range(len(ordered))]
    )
    return tuple(
        CoreCluster(
            name=name,
            cores=tuple(c.id for c in members),
            microarchitecture=members[0].microarchitecture,
            max_mhz=mhz,
            capacity=capacity,
            cpu_part=part,
        )
        for name, ((part, capacity, mhz), members) in zip(names, ordered)
    )


def read_topology(root: str | os.PathLike[str] = "/") -> Topology:
    """Read CPUs, clusters, memory and the device-tree model below ``root``.

    ``root`` may be a copy of a board's /proc and /sys; without a readable proc/cpuinfo it raises ProfileError.
    """
    base = Path(root)
    cpuinfo = _read(base / "proc/cpuinfo")
    if cpuinfo is None:
        raise ProfileError(f"cannot read {base / 'proc/cpuinfo'}; pass the root of a /proc + /sys tree")
    blocks, trailer = _cpuinfo_blocks(cpuinfo)
    arch = _arch(blocks)
    model_raw = _read(base / "proc/device-tree/model")
    model = model_raw.rstrip("\x00").strip() if model_raw else trailer.get("model")
    compat_raw = _read(base / "proc/device-tree/compatible")
    compatible = tuple(c for c in (compat_raw or "").split("\x00") if c)

    cpus = []
    sys_cpu = base / "sys/devices/system/cpu"
    for block in blocks:
        cpu_id = int(block["processor"])
        part = block.get("cpu part", "").lower() or None
        khz = _int_file(sys_cpu / f"cpu{cpu_id}/cpufreq/cpuinfo_max_freq")
        if khz:
            mhz = khz // 1000
        elif "cpu mhz" in block:
            mhz = round(float(block["cpu mhz"]))
        else:
            mhz = UNKNOWN_MHZ
        if part:
            uarch = ARM_PARTS.get(part, f"arm-part-{part}")
        else:
            uarch = block.get("model name", arch)
        cpus.append(CpuCore(cpu_id, part, uarch, mhz, _int_file(sys_cpu / f"cpu{cpu_id}/cpu_capacity")))

    mem_total_mb = None
    meminfo = _read(base / "proc/meminfo") or ""
    match = re.search(r"^MemTotal:\s+(\d+)\s*kB", meminfo, re.MULTILINE)
    if match:
        mem_total_mb = int(match.group(1)) // 1024
    return Topology(arch, model, compatible, tuple(cpus), _group_clusters(cpus), mem_total_mb)


def _match(topology: Topology, profiles: Iterable[DeviceProfile]) -> tuple[DeviceProfile, str] | None:
    candidates = [p for p in profiles if not p.name.startswith("generic-")]
    model = (topology.model or "").lower()
    for p in candidates:
        for pattern in p.detect.device_tree_model:
            if pattern.lower() in model:
                return p, f"device-tree model {topology.model!r} contains {pattern!r}"
    for p in candidates:
        hit = set(p.detect.compatible) & set(topology.compatible)
        if hit:
            return p, f"device-tree compatible lists {sorted(hit)[0]!r}"
    if not topology.model:
        # Without a device tree (ACPI boards), match the exact multiset of CPU parts.
        parts = sorted(c.part for c in topology.cpus if c.part)
        for p in candidates:
            expected = sorted(c.cpu_part for c in p.clusters for _ in c.cores if c.cpu_part)
            if parts and parts == expected:
                return p, f"CPU parts {sorted(set(parts))} and core count {len(parts)} match"
    return None


def _generic(topology: Topology, profiles: Iterable[DeviceProfile]) -> DeviceProfile:
    """The shipped generic profile for the architecture, rebuilt around the discovered cores.

    Budget: the template's budget/RAM ratio applied to the discovered RAM, capped at
    MAX_MODEL_BUDGET_MB like every shipped profile. Power modes:
    big.LITTLE → "performance" on the fastest cluster (latency, balanced) and "efficiency" on
    the slowest (power); homogeneous → "performance" on all cores and "powersave" on half.
    Idle power is the template's; a cluster's active power is the template's per-core figure
    times its cores, scaled by its capacity (see :func:`_active_watts`).
    """
    by_name = {p.name: p for p in profiles}
    template = by_name.get(f"generic-{topology.arch}") or by_name.get("generic-x86_64")
    if template is None:
        raise ProfileError("no generic-* profile found; reinstall edgesdk (its device_profiles are missing)")
    clusters = topology.clusters
    ram_mb = topology.mem_total_mb or template.ram_mb
    budget_mb = max(1, min(MAX_MODEL_BUDGET_MB, round(ram_mb * template.model_budget_mb / template.ram_mb)))
    perf_template = template.power_mode_for(RuntimeMode.LATENCY) or template.power_modes[0]
    idle = min(m.idle_watts for m in template.power_modes)
    fast = max(clusters, key=lambda c: (c.capacity, c.max_mhz))
    slow = min(clusters, key=lambda c: (c.capacity, c.max_mhz))
    perf = PowerMode("performance", idle, {fast.name: _active_watts(template, perf_template, fast)}, (fast.name,),
                     (RuntimeMode.LATENCY, RuntimeMode.BALANCED))
    if slow is not fast:
        low = PowerMode("efficiency", idle, {slow.name: _active_watts(template, perf_template, slow)}, (slow.name,),
                        (RuntimeMode.POWER,))
    else:
        low = PowerMode("powersave", idle, dict(perf.active_watts), (fast.name,), (RuntimeMode.POWER,),
                        online_cores=max(1, len(fast.cores) // 2))
    return dataclasses.replace(
        template,
        description=f"{template.description} (detected: {topology.model or topology.arch}, {len(topology.cpus)} cores)",
        arch=topology.arch,
        clusters=clusters,
        ram_mb=ram_mb,
        model_budget_mb=min(budget_mb, ram_mb),
        power_modes=(perf, low),
        origin="detected",
    )


def _active_watts(template: DeviceProfile, mode: PowerMode, cluster: CoreCluster) -> float:
    """The template's per-core active power (its first cluster, in its fastest mode) for ``cluster``'s cores,
    scaled by the cluster's capacity: a little core draws less."""
    unit = template.clusters[0]
    per_core = mode.active_watts.get(unit.name, max(mode.active_watts.values())) / len(unit.cores)
    return round(per_core * len(cluster.cores) * cluster.capacity / 1024, 3)


def detect(root: str | os.PathLike[str] = "/", profile_dirs: Iterable[str | os.PathLike[str]] = ()) -> Detection:
    """Read the topology below ``root`` and choose a profile for it, saying why."""
    topology = read_topology(root)
    profiles = list_profiles(profile_dirs)
    matched = _match(topology, profiles)
    if matched:
        profile, reason = matched
        missing = set(profile.cores) - {c.id for c in topology.cpus}
        if missing:
            reason += f"; note: profile cores {sorted(missing)} are not online here"
        return Detection(topology, profile, reason)
    profile = _generic(topology, profiles)
    return Detection(topology, profile, f"no shipped profile matches; built {profile.name} from the discovered cores")


def detect_device(root: str | os.PathLike[str] = "/", profile_dirs: Iterable[str | os.PathLike[str]] = ()) -> DeviceProfile:
    """The profile for this board: a shipped one when it matches, else a generic one."""
    return detect(root, profile_dirs).profile
