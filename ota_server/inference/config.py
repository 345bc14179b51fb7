"""What the inference endpoint serves and how: per-model batching, ORT threads, body and cache bounds.

Frozen dataclasses checked when built, and :func:`load_inference_config`, which reads the YAML
``edgesdk server --inference-config FILE`` takes::

    models:
      - name: digits                # required
        version: 1.2.0              # optional: pin this version (default: the newest, re-resolved per request)
        preferred_batch_size: 8     # optional batching settings, as BatchingConfig
        max_queue_delay_us: 500
        adaptive_queue_delay: true  # wait only while requests arrive faster than a batch finishes
        max_queue: 64
        batching: true
    limits:                         # optional (inference_config_from_file reads it): the transport
      max_body_bytes: 67108864      # limits of InferenceConfig (its docstring: defaults and why)
      max_concurrent_requests: 64
      max_buffered_bytes: 268435456
      version_loads_per_minute: 6
      json_worker_bytes: 1048576
      max_body_seconds: 60
      grpc_workers: null            # gRPC (grpc_service.py): null = the largest queue + 16, >= 32
      grpc_max_concurrent_calls: null   # inference calls at once; null = grpc_workers - 8
      grpc_max_send_bytes: 67108864
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from edgesdk.errors import EdgeSDKError, InputError

__all__ = ["BatchingConfig", "ServedModel", "InferenceConfig", "load_inference_config",
           "inference_config_from_file", "LIMIT_KEYS"]


def _positive(owner: str, name: str, value: Any, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InputError(f"{owner}.{name} is {value!r}; it must be an integer >= {minimum}")


@dataclass(frozen=True)
class BatchingConfig:
    """Dynamic batching of one model's concurrent requests (used only when its first input dim is dynamic).

    The batcher runs one ONNX Runtime call once the queued requests add up to
    ``preferred_batch_size`` rows or the oldest has waited ``max_queue_delay_us``; at most
    ``max_queue`` requests wait (or, with batching off, run) at once, the next one gets 503.
    ``adaptive_queue_delay`` waits only while requests arrive faster than the batch in hand
    would finish (``max_queue_delay_us`` stays the cap), so a lone client is not delayed.
    """

    preferred_batch_size: int = 8
    max_queue_delay_us: int = 500
    max_queue: int = 64
    enabled: bool = True
    adaptive_queue_delay: bool = True

    def __post_init__(self) -> None:
        _positive("BatchingConfig", "preferred_batch_size", self.preferred_batch_size)
        _positive("BatchingConfig", "max_queue_delay_us", self.max_queue_delay_us, minimum=0)
        _positive("BatchingConfig", "max_queue", self.max_queue)
        for flag in ("enabled", "adaptive_queue_delay"):
            if not isinstance(getattr(self, flag), bool):
                raise InputError(f"BatchingConfig.{flag} is {getattr(self, flag)!r}; it must be true or false")


@dataclass(frozen=True)
class ServedModel:
    """A model the endpoint serves: ``version`` None serves the newest stored version, a string pins one."""

    name: str
    version: str | None = None
    batching: BatchingConfig = field(default_factory=BatchingConfig)

    def __post_init__(self) -> None:
        from edgesdk.runtime.bundle import parse_version, safe_name

        if not isinstance(self.name, str):
            raise InputError(f"ServedModel.name is {self.name!r}; it must be a model name string")
        safe_name(self.name, "served model name")
        if self.version is not None:
            if not isinstance(self.version, str):
                raise InputError(f"ServedModel {self.name!r}: version {self.version!r} must be a string like '1.2.0'")
            parse_version(self.version)
        if not isinstance(self.batching, BatchingConfig):
            raise InputError(f"ServedModel {self.name!r}: batching must be a BatchingConfig, got "
                             f"{type(self.batching).__name__}")


@dataclass(frozen=True)
class InferenceConfig:
    """The whole endpoint: which models (None: every model in the repository, newest version, default batching).

    ``threads`` is ONNX Runtime's intra-op thread count per session (None: ORT's default);
    ``max_sessions`` bounds the sessions kept loaded (least recently used are dropped).
    HTTP transport limits (health and ``/metrics`` are never subject to them):

    - ``max_body_bytes`` (64 MiB): a larger body is refused with 413, by its Content-Length before
      any of it is read, or as soon as a body of unknown length streams past it;
    - ``max_concurrent_requests`` (64): infer and model requests in flight at once (body read,
      queued, running or being answered); one more is answered 503 with Retry-After at once;
    - ``max_buffered_bytes`` (256 MiB): request bodies held in memory at once, counted by
      Content-Length when the request is admitted (or as a body of unknown length streams); a
      body that would go over waits for nothing: 503 with Retry-After. With the defaults the
      bodies of 500 concurrent slow uploads hold at most 256 MiB of the server's memory;
    - ``version_loads_per_minute`` (6): loads of a version other than a model's default one
      (:mod:`.load_limit`); over it, 429 with Retry-After;
    - ``json_worker_bytes`` (1 MiB): JSON parts of requests over this size are decoded in a
      worker process (:mod:`.json_worker`), so the parse holds neither the loop nor its GIL;
      binary tensors (the binary data extension) need no parse and are always faster;
    - ``max_body_seconds`` (60): a body not received within it is answered 408, so a slow upload
      holds one of the ``max_concurrent_requests`` places for a bounded time.

    gRPC limits (:class:`~.grpc_service.GrpcServer`; a message over ``max_body_bytes`` is refused
    there too):

    - ``grpc_workers`` (None: the largest model queue plus 16, at least 32): threads, and the
      calls of any kind grpc takes at once;
    - ``grpc_max_concurrent_calls`` (None: ``grpc_workers`` less 8): inference calls at once; one
      more gets RESOURCE_EXHAUSTED, and the other workers stay free for health and metadata;
    - ``grpc_max_send_bytes`` (64 MiB): a bigger answer fails RESOURCE_EXHAUSTED.
    """

    models: tuple[ServedModel, ...] | None = None
    threads: int | None = None
    max_sessions: int = 8
    max_body_bytes: int = 64 * 1024 * 1024
    max_concurrent_requests: int = 64
    max_buffered_bytes: int = 256 * 1024 * 1024
    version_loads_per_minute: int = 6
    json_worker_bytes: int = 1024 * 1024
    max_body_seconds: float = 60.0
    grpc_workers: int | None = None
    grpc_max_concurrent_calls: int | None = None
    grpc_max_send_bytes: int = 64 * 1024 * 1024
    #: Batching for models not listed in ``models`` when ``models`` is None.
    default_batching: BatchingConfig = field(default_factory=BatchingConfig)

    def __post_init__(self) -> None:
        if self.models is not None:
            if not isinstance(self.models, tuple) or not all(isinstance(m, ServedModel) for m in self.models):
                raise InputError(f"InferenceConfig.models must be a tuple of ServedModel, got {self.models!r:.200}")
            names = [m.name for m in self.models]
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates:
                raise InputError(f"InferenceConfig.models lists {duplicates} more than once; list each model once")
        if self.threads is not None:
            _positive("InferenceConfig", "threads", self.threads)
        _positive("InferenceConfig", "max_sessions", self.max_sessions)
        for name in ("max_body_bytes", "max_concurrent_requests", "max_buffered_bytes",
                     "version_loads_per_minute", "json_worker_bytes", "grpc_max_send_bytes"):
            _positive("InferenceConfig", name, getattr(self, name))
        for name in ("grpc_workers", "grpc_max_concurrent_calls"):
            if getattr(self, name) is not None:
                _positive("InferenceConfig", name, getattr(self, name))
        seconds = self.max_body_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
            raise InputError(f"InferenceConfig.max_body_seconds is {seconds!r}; it must be a "
                             "number of seconds > 0")
        if self.max_buffered_bytes < self.max_body_bytes:
            raise InputError(f"InferenceConfig.max_buffered_bytes ({self.max_buffered_bytes}) is "
                             f"below max_body_bytes ({self.max_body_bytes}): a body at the limit "
                             "could never be taken; raise it")
        if not isinstance(self.default_batching, BatchingConfig):
            raise InputError("InferenceConfig.default_batching must be a BatchingConfig")

    def served(self, name: str) -> ServedModel | None:
        """The configuration of model ``name``, or None when this endpoint does not serve it."""
        if self.models is None:
            try:
                return ServedModel(name, None, self.default_batching)
            except EdgeSDKError:
                return None  # not a name a model can have, so not one this endpoint serves
        return next((m for m in self.models if m.name == name), None)


_MODEL_KEYS = {"name", "version", "batching"} | {f.name for f in fields(BatchingConfig)} - {"enabled"}
#: The keys of the YAML's ``limits`` mapping: InferenceConfig fields.
LIMIT_KEYS = ("max_body_bytes", "max_concurrent_requests", "max_buffered_bytes",
              "version_loads_per_minute", "json_worker_bytes", "max_sessions", "max_body_seconds",
              "grpc_workers", "grpc_max_concurrent_calls", "grpc_max_send_bytes")


def _read(path: Path, keys: set[str]) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InputError(f"cannot read the inference config {path}: {exc.strerror}; pass an existing YAML file") \
            from None
    except yaml.YAMLError as exc:
        raise InputError(f"the inference config {path} is not valid YAML ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), list) or set(data) - keys:
        shape = ("one key 'models'" if keys == {"models"}
                 else "the key 'models' (and optionally 'limits')")
        raise InputError(f"the inference config {path} must be a mapping with {shape} holding a "
                         "list, "
                         f"e.g. 'models: [{{name: digits}}]'; got {data!r:.200}")
    return data


def inference_config_from_file(path: str | os.PathLike[str],
                               threads: int | None = None) -> InferenceConfig:
    """The whole InferenceConfig of a YAML file: its ``models`` and its optional ``limits`` (see
    the module doc); ``threads`` as :class:`InferenceConfig` takes it."""
    path = Path(path)
    data = _read(path, {"models", "limits"})
    limits = data.get("limits") or {}
    if not isinstance(limits, dict) or set(limits) - set(LIMIT_KEYS):
        raise InputError(f"{path}: limits must be a mapping of {list(LIMIT_KEYS)}, "
                         f"got {limits!r:.200}")
    try:
        return InferenceConfig(models=_served(path, data), threads=threads, **limits)
    except EdgeSDKError as exc:
        raise type(exc)(f"{path}: {exc}") from None


def load_inference_config(path: str | os.PathLike[str]) -> tuple[ServedModel, ...]:
    """The served models of a YAML file without ``limits`` (read a file with them by
    :func:`inference_config_from_file`); InputError naming the file and entry otherwise."""
    path = Path(path)
    return _served(path, _read(path, {"models"}))


def _served(path: Path, data: dict[str, Any]) -> tuple[ServedModel, ...]:
    served = []
    for number, entry in enumerate(data["models"], 1):
        where = f"{path}: models[{number}]"
        if not isinstance(entry, dict) or "name" not in entry:
            raise InputError(f"{where} must be a mapping with at least 'name', got {entry!r:.200}")
        unknown = sorted(set(entry) - _MODEL_KEYS)
        if unknown:
            raise InputError(f"{where} has unknown keys {unknown}; use {sorted(_MODEL_KEYS)}")
        batching = {k: entry[k] for k in ("preferred_batch_size", "max_queue_delay_us", "max_queue",
                                          "adaptive_queue_delay") if k in entry}
        if "batching" in entry:
            batching["enabled"] = entry["batching"]
        version = entry.get("version")
        try:
            served.append(ServedModel(entry["name"], None if version is None else str(version),
                                      BatchingConfig(**batching)))
        except EdgeSDKError as exc:
            raise type(exc)(f"{where}: {exc}") from None
    return tuple(served)
