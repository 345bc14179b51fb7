"""Dynamic batching: concurrent requests to one model become one ONNX Runtime call.

A thread per batched model takes the oldest queued request and gathers others of the same
kind (same input names, dtypes and non-batch dims) until their rows add up to
``preferred_batch_size`` or the oldest has waited ``max_queue_delay_us``; it runs the
concatenation once and hands each request its rows of every output. At most ``max_queue``
requests wait; one more is refused at once with :class:`QueueFullError` (HTTP 503).

With ``adaptive_queue_delay`` (the default) the batcher waits for more rows only while
requests arrive faster than the batch in hand would finish: the average gap between arrivals
(the median of the last few, so the pause while a batch runs does not count as a slow arrival)
must be shorter than the average compute time of that many rows. A lone client, whose next
request comes only after its answer, then never waits; a crowd fills the batch. Until both
averages exist (the first requests) it waits as configured.

A request may carry a deadline (:mod:`.deadline`): one whose deadline has passed when a batch is
gathered is answered with :class:`~.deadline.DeadlineExceededError` and never run. The batch
thread runs below the event loop's priority (:mod:`.priority`).
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from edgesdk.errors import BackendError, EdgeSDKError

from .config import BatchingConfig
from .deadline import DeadlineExceededError, check
from .metrics import ModelMetrics
from .priority import below_the_event_loop

__all__ = ["Batcher", "QueueFullError", "BatcherClosedError"]

Outputs = dict[str, np.ndarray]
RunFn = Callable[[dict[str, np.ndarray]], Outputs]
_solo = itertools.count()
#: Weight of the newest sample in the average compute time per row.
_EWMA = 0.2
#: Arrival gaps kept for their median.
_GAPS = 8
#: An awaited arrival that has not come within this many average gaps ends the wait.
_GAP_PATIENCE = 2.0


class QueueFullError(EdgeSDKError):
    """A model's request queue is full; the endpoint answers 503 and the client should retry later or elsewhere."""


class BatcherClosedError(EdgeSDKError):
    """The batcher was closed (its model was unloaded); the caller runs the request without it."""


@dataclass(eq=False)  # identity: a request is removed from the queue as itself, arrays are not compared
class _Pending:
    inputs: dict[str, np.ndarray]
    rows: int
    key: Hashable
    future: Future[Outputs]
    queued_at: float
    deadline: float | None = None


def _kind(inputs: dict[str, np.ndarray]) -> tuple[int, Hashable]:
    """Rows of a request and what must match for two requests to be concatenated."""
    firsts = {v.shape[0] if v.ndim else -1 for v in inputs.values()}
    if len(firsts) != 1 or -1 in firsts:
        # Inputs that disagree on the batch dim cannot be split back; such a request runs alone.
        return 1, ("solo", next(_solo))
    key = tuple(sorted((name, v.dtype.str, v.shape[1:]) for name, v in inputs.items()))
    return firsts.pop(), key


class Batcher:
    """Queue and batch thread of one model version; :meth:`submit` returns a Future of that request's outputs."""

    def __init__(self, run: RunFn, config: BatchingConfig, metrics: ModelMetrics | None = None,
                 name: str = "batcher", clock: Callable[[], float] = time.perf_counter) -> None:
        self._run, self.config, self._metrics, self._clock = run, config, metrics, clock
        self._queue: deque[_Pending] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._paused = 0
        self._last_arrival: float | None = None
        self._gaps: deque[float] = deque(maxlen=_GAPS)  # seconds between the latest submits
        self._row_seconds: float | None = None  # compute seconds per row, averaged
        self._thread = threading.Thread(target=self._loop, name=f"batcher-{name}", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Requests waiting now."""
        with self._cond:
            return len(self._queue)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def submit(self, inputs: dict[str, np.ndarray],
               deadline: float | None = None) -> Future[Outputs]:
        """Queue one request; QueueFullError at once when ``max_queue`` requests already wait.

        ``deadline`` (in the batcher's clock, ``time.perf_counter`` unless given): the request is
        dropped with DeadlineExceededError if a batch is gathered after it."""
        rows, key = _kind(inputs)
        future: Future[Outputs] = Future()
        with self._cond:
            if self._closed:
                raise BatcherClosedError("the batcher is closed")
            if len(self._queue) >= self.config.max_queue:
                raise QueueFullError(f"the queue holds {len(self._queue)} requests, its max_queue; retry later, or "
                                     "raise max_queue in the inference config")
            now = self._clock()
            if self._last_arrival is not None:
                self._gaps.append(now - self._last_arrival)
            self._last_arrival = now
            self._queue.append(_Pending(inputs, rows, key, future, now, deadline))
            self._gauge()
            self._cond.notify_all()
        return future

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the batch thread between batches while inside (requests queue up to ``max_queue``), then resume."""
        with self._cond:
            self._paused += 1
        try:
            yield
        finally:
            with self._cond:
                self._paused -= 1
                self._cond.notify_all()

    def close(self, timeout: float = 30.0) -> None:
        """Stop taking requests; the thread runs what is queued, then exits."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.queue_depth.set(len(self._queue))

    def _take(self) -> list[_Pending] | None:
        """The next batch, or None once closed and drained (called with the lock held)."""
        while True:
            while not self._closed and (not self._queue or self._paused):
                self._cond.wait()
            if not self._queue:
                return None
            self._drop_expired()
            if self._queue:
                break
        first = self._queue[0]
        deadline = first.queued_at + self.config.max_queue_delay_us / 1e6
        while True:
            batch: list[_Pending] = []
            rows = 0
            for item in self._queue:
                if item.key == first.key and (not batch or rows + item.rows <= self.config.preferred_batch_size):
                    batch.append(item)
                    rows += item.rows
            now = self._clock()
            if rows >= self.config.preferred_batch_size or now >= deadline or self._closed:
                break
            patience = self._patience(rows)
            if patience is not None and patience <= 0:
                break
            queued = len(self._queue)
            self._cond.wait(deadline - now if patience is None else min(deadline - now, patience))
            if patience is not None and len(self._queue) == queued:
                break  # the arrival we waited for did not come: the crowd has thinned
        for item in batch:
            self._queue.remove(item)
        self._gauge()
        return batch

    def _drop_expired(self) -> None:
        """Answer every queued request whose deadline has passed with DeadlineExceededError
        (called with the lock held)."""
        now = self._clock()
        expired = [item for item in self._queue
                   if item.deadline is not None and now >= item.deadline]
        for item in expired:
            self._queue.remove(item)
            try:
                waited = 1e3 * (now - item.queued_at)
                check(item.deadline, now, f"{waited:.1f} ms in the batch queue")
            except DeadlineExceededError as exc:
                item.future.set_exception(exc)
        if expired:
            self._gauge()

    def _patience(self, rows: int) -> float | None:
        """How long to wait for the next arrival: None waits as configured, 0 or less runs the batch now."""
        if not self.config.adaptive_queue_delay or not self._gaps or self._row_seconds is None:
            return None
        gap = statistics.median(self._gaps)
        if gap >= self._row_seconds * rows:
            return 0.0
        return _GAP_PATIENCE * gap

    def _loop(self) -> None:
        below_the_event_loop()
        while True:
            with self._cond:
                batch = self._take()
            if batch is None:
                return
            self._execute(batch)

    def _execute(self, batch: list[_Pending]) -> None:
        started = self._clock()
        rows = sum(item.rows for item in batch)
        if self._metrics is not None:
            for item in batch:
                self._metrics.queue_seconds.observe(started - item.queued_at)
        try:
            if len(batch) == 1:
                inputs = batch[0].inputs
            else:
                inputs = {name: np.concatenate([item.inputs[name] for item in batch]) for name in batch[0].inputs}
            outputs = self._run(inputs)
            elapsed = self._clock() - started
            with self._cond:
                self._row_seconds = _average(self._row_seconds, elapsed / rows)
            if self._metrics is not None:
                self._metrics.compute_seconds.observe(elapsed)
                self._metrics.batch_size.observe(rows)
            if len(batch) == 1:
                batch[0].future.set_result(outputs)
                return
            uneven = [name for name, value in outputs.items() if value.ndim == 0 or value.shape[0] != rows]
            if uneven:
                raise BackendError(f"outputs {uneven} do not carry the batch dim ({rows} rows); set batching: false "
                                   "for this model in the inference config")
            offset = 0
            for item in batch:
                item.future.set_result({name: value[offset:offset + item.rows] for name, value in outputs.items()})
                offset += item.rows
        except BaseException as exc:  # every waiting request must be answered, whatever went wrong
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(exc)


def _average(mean: float | None, sample: float) -> float:
    return sample if mean is None else mean + _EWMA * (sample - mean)
