"""``predict_async`` for :class:`~edgesdk.Runtime` and :class:`~edgesdk.ManagedRuntime`: one implementation.

This module is the runtime's one seam to :mod:`edgesdk.offload`: no other module of
:mod:`edgesdk.runtime` imports it, and here it is imported only inside the functions that
need it (``tests/unit/test_layers.py`` holds both rules).

Both keep one :class:`~edgesdk.offload.dispatcher.Dispatcher` (made on first use, or at
construction with an offload policy); its local runs call the owner's ``predict``. The
offload package is imported only when the dispatcher is made, so a runtime that never calls
``predict_async`` pays nothing for it.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, cast

from edgesdk.errors import BackendError
from edgesdk.runtime.stats import StatsSnapshot

if TYPE_CHECKING:
    from edgesdk.offload.dispatcher import Dispatcher, LocalModel
    from edgesdk.offload.policy import OffloadPolicy as OffloadPolicy

__all__ = ["AsyncPredictions"]


class AsyncPredictions:
    """Mixin: the owner sets ``_closed``, has ``inputs``/``outputs``/``predict``, calls :meth:`_init_async` in its
    constructor and :meth:`_close_async` in ``close`` before releasing its model."""

    _closed: bool

    @staticmethod
    def _check_offload_arguments(offload: OffloadPolicy | None, max_local_queue: int | None) -> None:
        """Refuse a wrong ``offload`` or ``max_local_queue`` before the owner loads its model."""
        if offload is not None:
            from edgesdk.offload.policy import check_offload_arguments

            check_offload_arguments(offload, max_local_queue)

    def _init_async(self, offload: OffloadPolicy | None, max_local_queue: int | None, stats_window: int = 1000) -> None:
        """Record the settings; with an offload policy, make the dispatcher now (it checks the cloud model)."""
        self.offload = offload
        self._max_local_queue = max_local_queue
        self._stats_window = stats_window
        self._dispatcher: Dispatcher | None = None
        self._dispatcher_lock = threading.Lock()
        if offload is not None:
            self._ensure_dispatcher()

    def _ensure_dispatcher(self) -> Dispatcher:
        with self._dispatcher_lock:
            if self._dispatcher is None:
                from edgesdk.offload.dispatcher import DEFAULT_LOCAL_QUEUE, Dispatcher

                owner = cast("LocalModel", self)  # the owner has inputs, outputs and predict (see the class doc)
                self._dispatcher = Dispatcher(lambda: owner, self.offload, self._max_local_queue or DEFAULT_LOCAL_QUEUE,
                                              stats_window=self._stats_window)
            return self._dispatcher

    @property
    def dispatcher(self) -> Dispatcher | None:
        """The predict_async dispatcher (routing state, predictor, breaker); None until predict_async is first used
        without an offload policy."""
        return self._dispatcher

    def predict_async(self, inputs: Any, heavy: bool | None = None) -> Future[Any]:
        """Queue one inference; a :class:`concurrent.futures.Future` of what ``predict`` would return.

        Inputs are validated at once (:class:`InputError`). The request runs on the local queue
        or, with an offload policy, on the cloud endpoint, whichever is predicted to meet the
        latency objective (the rule is in :mod:`edgesdk.offload.dispatcher`); ``heavy=True``
        sends it to the cloud first when the cloud may take it (None: decided by the policy's
        ``heavy_input_bytes``). When neither side has room, or neither is predicted to meet the
        objective, it is refused at once with :class:`OverloadedError` saying why; nothing queues
        without bound. A cloud request that fails runs locally when it can still make its
        objective there; otherwise its Future fails with :class:`DeadlineExceededError` (a kind
        of OverloadedError). On a ManagedRuntime, local runs go to the model active when they
        start.
        """
        if self._closed:
            raise BackendError(f"this {type(self).__name__} is closed; create a new one to run predictions")
        return self._ensure_dispatcher().submit(inputs, heavy)

    def _with_paths(self, overall: StatsSnapshot) -> StatsSnapshot:
        """``overall`` plus where predict_async requests ran, once the dispatcher exists."""
        dispatcher = self._dispatcher
        return dispatcher.snapshot(overall) if dispatcher is not None else overall

    def _path_totals(self) -> tuple[int, int]:
        """predict_async requests run locally and sent to the cloud so far ((0, 0) before any)."""
        dispatcher = self._dispatcher
        return dispatcher.path_counts() if dispatcher is not None else (0, 0)

    def _close_async(self) -> None:
        """Stop the dispatcher: waiting requests fail, the running one finishes (it still needs the model)."""
        with self._dispatcher_lock:
            dispatcher = self._dispatcher
        if dispatcher is not None:
            dispatcher.close()
