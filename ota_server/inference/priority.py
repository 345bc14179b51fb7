"""Threads that run model code run at a lower priority than the endpoint's event loop (Linux nice
values).

The loop's work is short by design (parsing headers, health, metrics, runs proven short); a model
run sharing its core at the same priority holds it for a scheduler slice each time the loop wakes:
health took up to 10 ms (p99) beside a 0.3 s run on one core (benchmarks/endpoint/offload.py, event
loop section). On Linux a thread's nice value is its own and a new thread inherits its creator's, so
:func:`below_the_event_loop` is called by every thread that runs models (the unbatched runners, each
batcher thread) and by the thread that builds ONNX Runtime sessions, whose intra-op pool threads are
created with the session and so inherit it.
"""

from __future__ import annotations

import os
import threading

__all__ = ["RUN_NICENESS", "below_the_event_loop", "loop_niceness"]

#: How much lower than the event loop model code runs (nice levels).
RUN_NICENESS = 5


def loop_niceness() -> int:
    """The nice value of the process's main thread, which the event loop's thread inherited."""
    return os.getpriority(os.PRIO_PROCESS, os.getpid())


def below_the_event_loop() -> None:
    """Lower the calling thread to :data:`RUN_NICENESS` below the loop; a thread already there
    stays as it is
    (an unprivileged thread could not come back up). Not Linux, or not allowed: it keeps its
    priority."""
    try:
        target = loop_niceness() + RUN_NICENESS
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < target:
            os.setpriority(os.PRIO_PROCESS, tid, target)
    except (AttributeError, OSError):
        pass
