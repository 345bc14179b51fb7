"""The install transaction on a device: switch to a verified slot, health-check it, commit or point back.

One install, each step durable before the next::

    verify the slot        a slot kept from an earlier install is checked again (a fresh one
                           was verified as the store created it)
    record it as pending   state.json names the slot and the one ``current`` names now
    switch                 ``previous`` → the old slot, ``current`` → the new one
    health-check           load the model and run its bundle's sample (in the ManagedRuntime
                           when there is one, so it takes traffic only once it passed)
    commit or point back   state.json commits the new slot, or ``current`` names the old
                           slot again; either way the pending record is dropped

A crash at any step leaves a working model: :meth:`Installer.recover`, run before the
agent takes commands, serves the previous slot again and hands back the pending install
to be switched and checked once more (or drops it if its slot never got a name).

The installer knows nothing of MQTT: each install returns an :class:`InstallOutcome`
and the agent reports it.
"""

from __future__ import annotations

import logging
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesdk.agent.failpoints import failpoint
from edgesdk.agent.local_chunks import record_layout
from edgesdk.agent.managed import HealthReport, ManagedRuntime, health_check
from edgesdk.agent.power_keeper import PowerModeKeeper
from edgesdk.agent.store import ModelStore, PendingInstall
from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.protocol import ArchiveInfo
from edgesdk.fleet.records import AgentEvent
from edgesdk.runtime.bundle import read_bundle
from edgesdk.runtime.runtime import Runtime
from edgesdk.runtime.signing import KeySet

__all__ = ["Installer", "InstallOutcome"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InstallOutcome:
    """How one install ended, with the facts to report about it.

    ``committed``: ``details`` has ``apply_ms`` and ``health`` (``max_abs_error``,
    ``latency_ms``). ``rolled_back`` (switched, then pointed back): ``reason`` and
    ``restored``, the slot ``current`` names again. ``failed`` (never switched, nothing
    recorded): ``reason``.
    """

    event: AgentEvent  # COMMITTED, ROLLED_BACK or FAILED
    install: PendingInstall
    details: dict[str, Any]


class Installer:
    """Runs installs into a :class:`ModelStore` and recovers the one a crash interrupted (see the module doc).

    With a ManagedRuntime the health check is its swap, so the app's model changes only
    when the new one passes; without one the model is loaded on its own just for the check.
    Not thread-safe: the agent calls it from its one worker thread.

    With a ``power`` keeper (the agent's ``--apply-power-mode``) the board is put in the power mode of
    the bundle that serves after each install, committed or rolled back, and on :meth:`recover`. It is
    applied after the health check, not before: a bundle that fails its check must not leave the
    board in its mode (the check's latency gate, 5x the planned latency, leaves room for the clock).
    """

    def __init__(self, store: ModelStore, runtime: ManagedRuntime | None = None,
                 bundle_keys: Callable[[], KeySet | None] = lambda: None, power: PowerModeKeeper | None = None) -> None:
        self.store = store
        self.runtime = runtime
        #: Applies the serving bundle's power mode (None: the agent leaves the board's power state alone).
        self.power = power
        #: The keys bundles must be signed with, asked at each install (the root's bundles role, which a rotation
        #: may have changed since the transfer began); None: the signed command's hashes are the only check.
        self.bundle_keys = bundle_keys

    def unpack(self, slot: str, archive: Path, info: ArchiveInfo) -> None:
        """Unpack a downloaded, hash-checked ``archive`` into a new verified slot, and record its chunk layout.

        The manifest is verified first (the bundles keys' threshold, when the device has them), then only the files
        it lists are written (:meth:`ModelStore.unpack_slot`).
        Raises :class:`EdgeSDKError` when the bundle inside is refused (nothing is left behind). A layout that
        cannot be recorded is only logged: without it the next version fetches every chunk, but this install
        does not need it.
        """
        self.store.unpack_slot(slot, archive, self.bundle_keys())
        try:
            record_layout(self.store.root, slot, archive, info)
        except (OSError, tarfile.TarError) as exc:
            log.warning("could not record the chunk layout of %s (%s)", slot, exc)

    def install(self, slot: str, *, deployment_id: str | None = None, name: str | None = None,
                version: str | None = None, verify: bool = True, started: float | None = None,
                judge_s: float | None = None) -> InstallOutcome:
        """Install the named slot: verify it (unless the caller just did), record it, then :meth:`activate` it.

        ``started`` is when applying began (e.g. the archive check), so ``apply_ms`` covers
        verify + switch + load; by default it is now. ``judge_s`` (the command's) is kept with the
        pending install, so its commit starts the judged window even after a restart.
        """
        started = started or time.perf_counter()
        pending = PendingInstall(slot, self.store.pointer("current"), deployment_id, name, version,
                                 judge_s)
        if verify:
            try:
                self.store.verify_slot(slot, self.bundle_keys())
            except EdgeSDKError as exc:
                return InstallOutcome(AgentEvent.FAILED, pending, {"reason": f"slot {slot} does not verify: {exc}"})
        state = self.store.load_state()
        state.pending = pending
        self.store.save_state(state)
        failpoint("before_switch")
        return self.activate(pending, started)

    def activate(self, pending: PendingInstall, started: float | None = None) -> InstallOutcome:
        """Switch ``current`` to a recorded install, health-check it, and commit it or point back."""
        started = started or time.perf_counter()
        slot, previous = pending.slot, pending.previous
        if previous and previous != slot and self.store.has_slot(previous):
            self.store.set_pointer("previous", previous)
        self.store.set_pointer("current", slot)
        failpoint("after_switch")
        try:
            report = self._health_check(slot)
        except Exception as exc:  # whatever stops the new model from serving sends the device back
            if previous and self.store.has_slot(previous):
                self.store.set_pointer("current", previous)
            self._finish(committed=None)
            self._apply_power_mode()
            return InstallOutcome(AgentEvent.ROLLED_BACK, pending, {"reason": f"{type(exc).__name__}: {exc}",
                                                           "restored": previous})
        self._finish(committed=slot)
        self._apply_power_mode()
        return InstallOutcome(AgentEvent.COMMITTED, pending, {
            "apply_ms": (time.perf_counter() - started) * 1e3,
            "health": {"max_abs_error": report.max_abs_error, "latency_ms": report.latency_ms}})

    def recover(self) -> PendingInstall | None:
        """Bring the store back to a working model after a crash; return an install to :meth:`activate` again.

        A pending install whose slot exists was complete and verified before the crash:
        ``current`` names the previous slot meanwhile and the install is returned. One whose
        slot never got a name is dropped. The ManagedRuntime, if empty, loads the current model.
        """
        state = self.store.load_state()
        pending, resume = state.pending, None
        if pending is None:
            committed = state.committed
            if committed and self.store.pointer("current") != committed and self.store.has_slot(committed):
                self.store.set_pointer("current", committed)
        else:
            if pending.previous and self.store.has_slot(pending.previous):
                self.store.set_pointer("current", pending.previous)
            if self.store.has_slot(pending.slot):
                resume = pending
            else:
                state.pending = None
                self.store.save_state(state)
        self._load_current()
        self._apply_power_mode()
        return resume

    def _apply_power_mode(self) -> None:
        """Put the board in the power mode of the bundle ``current`` names (with a keeper; its outcome is logged)."""
        path = self.store.current_path()
        if self.power is not None and path is not None:
            try:
                self.power.apply(path, self.runtime.mode if self.runtime is not None else None)
            except EdgeSDKError as exc:  # an unreadable manifest already failed the install; keep the agent up
                log.error("cannot apply the power mode of %s: %s", path, exc)

    def _finish(self, committed: str | None) -> None:
        """Drop the pending record; with ``committed``, record that slot as the one the device runs."""
        state = self.store.load_state()
        if committed is not None:
            state.committed = committed
        state.pending = None
        self.store.save_state(state)

    def _health_check(self, slot: str) -> HealthReport:
        if self.runtime is not None:
            return self.runtime.swap(self.store.slots / slot)
        bundle = read_bundle(self.store.slots / slot, verify_model=False)
        with Runtime(bundle.path, profile=None) as runtime:  # hashes the model as it loads it
            return health_check(runtime, bundle)

    def _load_current(self) -> None:
        path = self.store.current_path()
        if self.runtime is not None and path is not None and self.runtime.bundle is None:
            try:
                self.runtime.swap(path)
            except EdgeSDKError as exc:  # keep the agent up: the server can still send a working version
                log.error("installed model %s does not load or pass its health check: %s", path, exc)
