"""How the command line shows logs: edgesdk's own warnings always, INFO and third-party chatter on request.

``edgesdk -v COMMAND`` (or ``EDGESDK_VERBOSE=1``) shows INFO logs and lets libraries print
what they print (the quantizer's progress, LiteRT's delegate lines). Without it only
edgesdk's warnings and errors reach the terminal; long-running services (agent, server)
raise their own loggers to INFO because their log is the operator's record.
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["configure", "is_verbose", "VERBOSE_ENV"]

#: Set for child processes (measurement workers, the onnx2tf tool) so they follow the parent's choice.
VERBOSE_ENV = "EDGESDK_VERBOSE"


def is_verbose() -> bool:
    """True when the user asked for third-party output and INFO logs."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def configure(verbose: bool | None = None, info_loggers: tuple[str, ...] = ()) -> None:
    """Send logs to stderr as ``LEVEL name: message``: WARNING by default, INFO when verbose.

    ``info_loggers`` are raised to INFO even when not verbose (a service's own progress).
    """
    if verbose is None:
        verbose = is_verbose()
    if verbose:
        os.environ[VERBOSE_ENV] = "1"
    root = logging.getLogger()
    if not any(getattr(h, "_edgesdk", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler._edgesdk = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    for name in info_loggers:
        logging.getLogger(name).setLevel(logging.INFO)
    if not verbose:
        import warnings

        # Libraries (onnx, onnxruntime's quantizer, torch) repeat deprecation chatter the user cannot act on.
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
