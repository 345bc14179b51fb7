"""A device profile as the YAML schema's plain data: for ``edgesdk profile --json`` and the measure worker's request.

:func:`edgesdk.runtime.profiles.profile_from_dict` reads it back:
``profile_from_dict(profile_to_dict(p)) == p`` (but ``origin``).
"""

from __future__ import annotations

from typing import Any

from edgesdk.runtime.board_power import BoardPower
from edgesdk.runtime.profiles import CoreCluster, DeviceProfile, PowerMode

__all__ = ["profile_to_dict"]


def profile_to_dict(profile: DeviceProfile) -> dict[str, Any]:
    """The YAML schema form of a profile: ``profile_from_dict(profile_to_dict(p)) == p`` (but ``origin``)."""
    def cluster(c: CoreCluster) -> dict[str, Any]:
        data = {"name": c.name, "cores": list(c.cores), "microarchitecture": c.microarchitecture,
                "cpu_part": c.cpu_part, "max_mhz": c.max_mhz, "capacity": c.capacity, "emulated_cpu": c.emulated_cpu}
        data.update({k: getattr(c, k) for k in ("parallel_efficiency", "shared_power_share")
                     if getattr(c, k) is not None})
        return data

    def mode(m: PowerMode) -> dict[str, Any]:
        data: dict[str, Any] = {"name": m.name, "idle_watts": m.idle_watts, "active_watts": dict(m.active_watts),
                                "clusters": list(m.clusters),
                                "serves": [s.value for s in m.serves], "max_mhz": dict(m.max_mhz)}
        data.update({k: getattr(m, k) for k in ("online_cores", "governor", "nvpmodel") if getattr(m, k) is not None})
        return data

    def power(p: BoardPower) -> dict[str, Any]:
        data: dict[str, Any] = {"scope": p.scope}
        if p.sensor is not None:
            s = p.sensor
            data["sensor"] = {"kind": s.kind, "paths": list(s.paths), "scope": s.scope, "unit": s.unit,
                              "scale": s.scale, "offset_watts": s.offset_watts}
        if p.sleep_watts is not None:
            data.update(sleep_watts=p.sleep_watts, resume_s=p.resume_s, resume_mj=p.resume_mj)
        return data

    return {
        "name": profile.name,
        "description": profile.description,
        "arch": profile.arch,
        "sources": list(profile.sources),
        "cpu": {"clusters": [cluster(c) for c in profile.clusters]},
        "memory": {"ram_mb": profile.ram_mb, "model_budget_mb": profile.model_budget_mb},
        "power_modes": [mode(m) for m in profile.power_modes],
        "accelerators": [{"name": a.name, "kind": a.kind.value, "litert_delegates": list(a.litert_delegates),
                          "onnxruntime_providers": list(a.onnxruntime_providers), "peak_tflops": dict(a.peak_tflops),
                          "memory_gbps": a.memory_gbps, "max_mhz": a.max_mhz} for a in profile.accelerators],
        "detect": {"device_tree_model": list(profile.detect.device_tree_model),
                   "compatible": list(profile.detect.compatible), "cpu_parts": list(profile.detect.cpu_parts)},
        "power": power(profile.power),
    }
