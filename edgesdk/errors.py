"""The edgesdk exception tree.

Every error edgesdk raises on purpose is an :class:`EdgeSDKError`; errors of the
libraries underneath (onnx, onnxruntime, LiteRT, paho-mqtt, PyYAML) are translated
once, where they cross into edgesdk, with ``raise ... from exc``::

    EdgeSDKError                     exit 1
    ├── ProfileError                 exit 3   a device profile file is missing or invalid
    ├── ModelFormatError             exit 4   a model file is missing, corrupt or of the wrong kind
    ├── BackendError                 exit 5   no usable inference library, or it failed at run time
    ├── InputError                   exit 6   predict() got names, shapes or dtypes the model does not take
    ├── ScheduleError                exit 7   a power mode or core set cannot be applied
    ├── BudgetError                  exit 8   no model variant fits a device's memory or power budget
    │   └── InfeasibleBudgetError    exit 26  the board's idle power alone exceeds the power budget, in every mode
    ├── SignatureError               exit 9   a bundle's signature or hash does not verify
    │   └── TrustError               exit 27  root-of-trust metadata refused: malformed, a rollback to an older
    │                                         version, expired, or not signed by the keys its role needs
    ├── TransferError                exit 10  an OTA transfer failed or was truncated
    │   └── ReportError              exit 29  a device's report (state, event, chunk request, measurement
    │                                         result) refused: a field of the wrong type, range or length
    ├── OffloadError                 exit 11  the cloud offload endpoint could not serve a request
    ├── ConversionError              exit 12  a model could not be loaded, exported, quantized or converted
    │   └── UnsupportedOpError       exit 13  a converter has no kernel for an op (the op is named)
    ├── DataError                    exit 14  calibration/evaluation data is empty or does not fit the model
    ├── BundleError                  exit 15  a bundle directory or manifest is missing fields or malformed
    ├── HealthCheckError             exit 16  a new model failed its on-device health or latency check
    ├── RolloutError                 exit 17  a rollout aborted or ended with failed devices
    │   ├── RolloutTimeoutError      exit 18  `--wait` ran out while the rollout was still running
    │   └── RolloutInconclusiveError exit 31  a stage paused: too few devices reported enough figures on the
    │                                          release by its deadline (promote accepts it, abort rolls it back)
    ├── NotFoundError                exit 19  the server has no such rollout, bundle, device or measurement
    ├── ConflictError                exit 20  the request contradicts the server's state (a version already
    │   │                                     stored with other content, already installed, a rollout running)
    │   └── ReleaseCheckError        exit 28  a push refused before anything was sent: another model than the
    │                                         group runs (--replace MODEL), or other inputs/outputs
    │                                         (--allow-signature-change)
    ├── BrokerError                  exit 21  the MQTT broker refused this client (credentials, ACL)
    ├── OverloadedError              exit 22  predict_async() refused a request at once: the local queue and
    │                                         the cloud offload are both full (load shedding)
    │   └── DeadlineExceededError    exit 32  a request dropped unrun: it could no longer meet its
    │                                         deadline (latency objective, or the V2 timeout)
    ├── StorageError                 exit 23  the device's store has no room for an update (or its retention
    │                                         settings are invalid)
    ├── EmulatorError                exit 24  the board emulator (qemu-user and its aarch64 userland) is
    │   │                                     missing or failed to run a variant
    │   └── BoardRuntimeError        exit 30  a variant fails to load or run in the board's own runtime
    │                                         (under the emulator) while it runs on this host
    └── SensorError                  exit 25  a board's power sensor exists but cannot be read or parsed

Each message says what was wrong, with the value, and what to do about it. The CLI
catches ``EdgeSDKError`` in one place, prints the message and exits with ``exit_code``.
"""

from __future__ import annotations

__all__ = [
    "EdgeSDKError",
    "ProfileError",
    "ModelFormatError",
    "BackendError",
    "InputError",
    "ScheduleError",
    "BudgetError",
    "InfeasibleBudgetError",
    "SensorError",
    "SignatureError",
    "TrustError",
    "TransferError",
    "OffloadError",
    "ConversionError",
    "UnsupportedOpError",
    "DataError",
    "BundleError",
    "HealthCheckError",
    "RolloutError",
    "RolloutTimeoutError",
    "RolloutInconclusiveError",
    "NotFoundError",
    "ConflictError",
    "ReleaseCheckError",
    "BrokerError",
    "OverloadedError",
    "DeadlineExceededError",
    "StorageError",
    "EmulatorError",
    "BoardRuntimeError",
]


class EdgeSDKError(Exception):
    """Base of every error edgesdk raises on purpose."""

    exit_code: int = 1


class ProfileError(EdgeSDKError):
    """A device profile is missing, or its YAML has a missing, mistyped or unknown field."""

    exit_code = 3


class ModelFormatError(EdgeSDKError):
    """A model file is missing, truncated, corrupt, or not the format its name says."""

    exit_code = 4


class BackendError(EdgeSDKError):
    """No usable inference library is installed, or the library failed while running."""

    exit_code = 5


class InputError(EdgeSDKError, ValueError):
    """``predict()`` got input names, shapes or dtypes the model does not accept."""

    exit_code = 6


class ScheduleError(EdgeSDKError):
    """A requested power mode, thread count or core set cannot be applied."""

    exit_code = 7


class BudgetError(EdgeSDKError):
    """No model variant fits the device profile's memory or power budget."""

    exit_code = 8


class InfeasibleBudgetError(BudgetError):
    """A power budget no variant can meet on the board: its idle power alone exceeds it in every power mode."""

    exit_code = 26


class SignatureError(EdgeSDKError):
    """A bundle's signature, manifest or content hash does not verify."""

    exit_code = 9


class TrustError(SignatureError):
    """Root-of-trust metadata (edgesdk.fleet.trust) was refused: malformed, an older version than the one held
    (a rollback), expired, or without the signatures its role's threshold needs."""

    exit_code = 27


class TransferError(EdgeSDKError):
    """An over-the-air transfer failed, was truncated, or a chunk did not verify."""

    exit_code = 10


class ReportError(TransferError):
    """A message a device sent (state, event, chunk request, measurement result) was refused unread.

    ``reason`` is a short machine word (``json``, ``type``, ``range``, ``length``, ``id``, ``missing``) and ``field``
    the report field at fault (``""``: the message as a whole); servers count refusals by ``reason``.
    """

    exit_code = 29

    def __init__(self, message: str, *, reason: str, field: str = "") -> None:
        super().__init__(message)
        self.reason, self.field = reason, field


class OffloadError(EdgeSDKError):
    """The cloud offload endpoint could not serve a request.

    ``status`` is the server's HTTP status (None when no answer came); ``transient`` is True for
    failures that may pass (connection refused or reset, timeouts, 5xx answers), False for
    configuration errors (an unknown model, inputs that differ from the local model).
    """

    exit_code = 11

    def __init__(self, message: str, status: int | None = None, transient: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.transient = transient


class ConversionError(EdgeSDKError):
    """A model could not be loaded, exported, simplified, quantized or converted."""

    exit_code = 12


class UnsupportedOpError(ConversionError):
    """A converter cannot handle some op types; ``ops`` names them."""

    exit_code = 13

    def __init__(self, message: str, ops: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.ops = ops


class DataError(EdgeSDKError, ValueError):
    """Calibration or evaluation data is empty, or its shape/dtype does not match the model."""

    exit_code = 14


class BundleError(EdgeSDKError):
    """A bundle directory or its manifest is missing, malformed, or of an unknown format_version."""

    exit_code = 15


class HealthCheckError(EdgeSDKError):
    """A newly installed model gave wrong outputs on its health sample or missed its latency gate."""

    exit_code = 16


class RolloutError(EdgeSDKError):
    """A rollout aborted, or finished with devices that failed to update."""

    exit_code = 17


class RolloutTimeoutError(RolloutError):
    """A rollout was still running when the caller's ``--wait`` ran out."""

    exit_code = 18


class RolloutInconclusiveError(RolloutError):
    """A rollout paused because a stage's canary verdict was inconclusive: too few of its devices reported enough
    figures on the release by the stage's deadline (the operator promotes or aborts it)."""

    exit_code = 31


class NotFoundError(EdgeSDKError):
    """The server has no rollout, bundle version, device or measurement by that id or name."""

    exit_code = 19


class ConflictError(EdgeSDKError):
    """The request contradicts the server's state: e.g. a stored version with other content, a version a group
    already runs, or a rollout already running for the group."""

    exit_code = 20


class ReleaseCheckError(ConflictError):
    """A push was refused before anything was sent: it would replace the group's model with another one (pass
    ``--replace MODEL``), or change the inputs or outputs the group's apps feed (pass ``--allow-signature-change``)."""

    exit_code = 28


class BrokerError(EdgeSDKError):
    """The MQTT broker refused this client: wrong credentials, or an ACL that denies its own topics."""

    exit_code = 21


class OverloadedError(EdgeSDKError):
    """``predict_async()`` refused a request at once because the local queue and the cloud offload are both full.

    Nothing was queued: the caller decides whether to drop the frame, retry later or slow down.
    """

    exit_code = 22


class DeadlineExceededError(OverloadedError):
    """A request was dropped unrun because it can no longer meet its deadline.

    On the device (``predict_async`` under an offload policy) the deadline is the latency
    objective from submission; on the inference endpoint it is the request's V2 ``timeout``
    parameter (answered 504, gRPC DEADLINE_EXCEEDED). A kind of :class:`OverloadedError` (load
    shed, nothing ran), so a caller that drops refused frames drops these too. ``objective_ms`` is
    the objective and ``late_ms`` how far past it the request is, or would be, when dropped (None
    where not known).
    """

    exit_code = 32

    def __init__(self, message: str, objective_ms: float | None = None,
                 late_ms: float | None = None) -> None:
        super().__init__(message)
        self.objective_ms = objective_ms
        self.late_ms = late_ms


class StorageError(EdgeSDKError):
    """The device's model store cannot take an update: too little free disk once old slots are pruned, or a
    retention setting (slots to keep, space to leave free) that is out of range."""

    exit_code = 23


class EmulatorError(EdgeSDKError):
    """The board emulator cannot run: qemu-user or the aarch64 userland is missing, or a variant failed under it.

    The converter then falls back to scaling this host's timings; the message says how to enable it.
    """

    exit_code = 24


class BoardRuntimeError(EmulatorError):
    """A variant fails in the board's own runtime (its aarch64 onnxruntime or LiteRT, under the
    emulator) while it runs on this host: refused with an error, crashed with a signal, not
    finished in the emulator's time, or stopped before its counted runs ended. The converter
    rejects that variant with the board's reason and keeps the others' emulated figures."""

    exit_code = 30


class SensorError(EdgeSDKError):
    """A power sensor exists but cannot be read (permissions, a vanished file) or its output cannot be parsed."""

    exit_code = 25
