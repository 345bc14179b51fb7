"""edgesdk: put trained models on small devices and keep them healthy there.

Public API (imported lazily so ``edgesdk --help`` and small scripts start fast)::

    import edgesdk
    profile = edgesdk.detect_device()
    with edgesdk.Runtime("model.tflite", profile=profile, mode="latency") as rt:
        rt.predict(frame)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgesdk.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "Runtime": "edgesdk.runtime.runtime",
    "RuntimeInfo": "edgesdk.runtime.runtime",
    "TensorSpec": "edgesdk.runtime.tensors",
    "StatsSnapshot": "edgesdk.runtime.stats",
    "DeviceProfile": "edgesdk.runtime.profiles",
    "CoreCluster": "edgesdk.runtime.profiles",
    "PowerMode": "edgesdk.runtime.profiles",
    "Accelerator": "edgesdk.runtime.profiles",
    "RuntimeMode": "edgesdk.runtime.profiles",
    "load_profile": "edgesdk.runtime.profiles",
    "list_profiles": "edgesdk.runtime.profiles",
    "detect_device": "edgesdk.runtime.detect",
    "CorePlan": "edgesdk.runtime.scheduling",
    "plan_cores": "edgesdk.runtime.scheduling",
    "EdgeSDKError": "edgesdk.errors",
    "ProfileError": "edgesdk.errors",
    "ModelFormatError": "edgesdk.errors",
    "BackendError": "edgesdk.errors",
    "InputError": "edgesdk.errors",
    "ScheduleError": "edgesdk.errors",
    "BudgetError": "edgesdk.errors",
    "SignatureError": "edgesdk.errors",
    "TrustError": "edgesdk.errors",
    "TransferError": "edgesdk.errors",
    "OffloadError": "edgesdk.errors",
    "ConversionError": "edgesdk.errors",
    "UnsupportedOpError": "edgesdk.errors",
    "DataError": "edgesdk.errors",
    "BundleError": "edgesdk.errors",
    "HealthCheckError": "edgesdk.errors",
    "RolloutError": "edgesdk.errors",
    "RolloutTimeoutError": "edgesdk.errors",
    "RolloutInconclusiveError": "edgesdk.errors",
    "NotFoundError": "edgesdk.errors",
    "ConflictError": "edgesdk.errors",
    "ReleaseCheckError": "edgesdk.errors",
    "BoardRuntimeError": "edgesdk.errors",
    "BrokerError": "edgesdk.errors",
    "OverloadedError": "edgesdk.errors",
    "DeadlineExceededError": "edgesdk.errors",
    "StorageError": "edgesdk.errors",
    "EmulatorError": "edgesdk.errors",
    "SensorError": "edgesdk.errors",
    "InfeasibleBudgetError": "edgesdk.errors",
    "OffloadPolicy": "edgesdk.offload.policy",
    "ManagedRuntime": "edgesdk.agent.managed",
}

__all__ = ["__version__", *_EXPORTS]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


if TYPE_CHECKING:
    from edgesdk.agent.managed import ManagedRuntime
    from edgesdk.errors import (
        BackendError,
        BoardRuntimeError,
        BrokerError,
        BudgetError,
        BundleError,
        ConflictError,
        ConversionError,
        DataError,
        DeadlineExceededError,
        EdgeSDKError,
        EmulatorError,
        HealthCheckError,
        InfeasibleBudgetError,
        InputError,
        ModelFormatError,
        NotFoundError,
        OffloadError,
        OverloadedError,
        ProfileError,
        ReleaseCheckError,
        RolloutError,
        RolloutInconclusiveError,
        RolloutTimeoutError,
        ScheduleError,
        SensorError,
        SignatureError,
        StorageError,
        TransferError,
        TrustError,
        UnsupportedOpError,
    )
    from edgesdk.offload.policy import OffloadPolicy
    from edgesdk.runtime.detect import detect_device
    from edgesdk.runtime.profiles import (
        Accelerator,
        CoreCluster,
        DeviceProfile,
        PowerMode,
        RuntimeMode,
        list_profiles,
        load_profile,
    )
    from edgesdk.runtime.runtime import Runtime, RuntimeInfo
    from edgesdk.runtime.scheduling import CorePlan, plan_cores
    from edgesdk.runtime.stats import StatsSnapshot
    from edgesdk.runtime.tensors import TensorSpec
