"""How the command line shows logs: edgesdk's own warnings always, INFO and third-party chatter on request.

``edgesdk -v COMMAND`` (or ``EDGESDK_VERBOSE=1``) shows INFO logs and lets libraries print
what they print (the quantizer's progress, LiteRT's delegate lines). Without it only
edgesdk's warnings and errors reach the terminal; long-running services (agent, server)
raise their own loggers to INFO because their log is the operator's record.

``edgesdk --log-format json COMMAND`` (or ``EDGESDK_LOG_FORMAT=json``) writes one JSON object
per line instead, for log collectors (Loki, Elasticsearch, CloudWatch)::

    {"ts": "2026-11-23T12:00:00.123Z", "level": "INFO", "logger": "edgesdk.ota_server.rollouts.engine",
     "message": "rollout r1: stage 1 sent", "rollout": "r1"}

with ``exc`` holding the traceback when there is one, and every JSON-serialisable field a
caller passed with ``extra=`` (others are left out rather than breaking the line).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import datetime, timezone
from typing import Any

from edgesdk.errors import EdgeSDKError

__all__ = ["configure", "is_verbose", "log_format_from_env", "JsonFormatter", "VERBOSE_ENV", "LOG_FORMAT_ENV", "LOG_FORMATS"]

#: Set for child processes (measurement workers, the onnx2tf tool) so they follow the parent's choice.
VERBOSE_ENV = "EDGESDK_VERBOSE"
#: ``text`` or ``json``; set by ``--log-format`` so child processes and the services' own set-up follow it.
LOG_FORMAT_ENV = "EDGESDK_LOG_FORMAT"
LOG_FORMATS = ("text", "json")


def is_verbose() -> bool:
    """True when the user asked for third-party output and INFO logs."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def log_format_from_env() -> str:
    """The log format asked for in ``EDGESDK_LOG_FORMAT``: ``text`` (also when unset) or ``json``."""
    chosen = os.environ.get(LOG_FORMAT_ENV, "").strip().lower() or "text"
    if chosen not in LOG_FORMATS:
        raise EdgeSDKError(f"{LOG_FORMAT_ENV}={os.environ[LOG_FORMAT_ENV]!r} is not a log format; set it to "
                           f"{' or '.join(LOG_FORMATS)}")
    return chosen


def configure(verbose: bool | None = None, info_loggers: tuple[str, ...] = (), log_format: str | None = None) -> None:
    """Send logs to stderr as ``LEVEL name: message``: WARNING by default, INFO when verbose.

    ``info_loggers`` are raised to INFO even when not verbose (a service's own progress).
    ``log_format`` ``json`` writes one JSON object per line (:class:`JsonFormatter`); None keeps
    what ``EDGESDK_LOG_FORMAT`` says (``text`` when unset).
    """
    if log_format is None:
        log_format = log_format_from_env()
    elif log_format not in LOG_FORMATS:
        raise EdgeSDKError(f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}; pass one of those")
    os.environ[LOG_FORMAT_ENV] = log_format
    if verbose is None:
        verbose = is_verbose()
    if verbose:
        os.environ[VERBOSE_ENV] = "1"
    root = logging.getLogger()
    handler = next((h for h in root.handlers if getattr(h, "_edgesdk", False)), None)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler._edgesdk = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    for name in info_loggers:
        logging.getLogger(name).setLevel(logging.INFO)
    if not verbose:
        import warnings

        # Libraries (onnx, onnxruntime's quantizer, torch) repeat deprecation chatter the user cannot act on.
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)


# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_RECORD_FIELDS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (ISO 8601 UTC, ms), ``level``, ``logger``, ``message``, ``exc``, extras.

    Extra fields that are not JSON-serialisable, or that would overwrite one of those keys, are left out.
    """

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (newlines inside the message or traceback are escaped)."""
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exc"] = record.exc_text or self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        for key, value in record.__dict__.items():
            if key in _RECORD_FIELDS or key in line:
                continue
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError):
                continue
            line[key] = value
        return json.dumps(line, ensure_ascii=False, allow_nan=False)
