"""Checks before a rollout sends anything: is it the group's model, and does it keep the group's inputs and outputs?

An app on the device feeds the model of its group (``ManagedRuntime`` follows whatever the store
holds). A push that swaps the model for another one, or keeps its name and changes its inputs or
outputs, breaks the app on every device it reaches. Both are allowed, but only when the operator
says so, as Mender's ``provides``/``depends`` and a container registry's platform check refuse
an artifact that does not match what runs:

- another model name than the group runs needs ``replace=<the model it runs>``;
- other inputs or outputs than the version the group runs need ``allow_signature_change``; the
  difference is returned either way so the push can print it.

What the group runs is its release (desired state) or, before its first completed rollout, the
model and version most of its devices report.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from edgesdk.errors import NotFoundError, ReleaseCheckError
from edgesdk.ota_server.repository import ModelRepository
from edgesdk.ota_server.store.fleet_db import FleetDB
from edgesdk.runtime.bundle import read_bundle
from edgesdk.runtime.tensors import signature_changes

__all__ = ["ReleaseCheck", "check_release"]


@dataclass(frozen=True)
class ReleaseCheck:
    """What a push changes for a group: the model and version it runs now, and how inputs and outputs change."""

    running_model: str | None
    running_version: str | None
    signature_changes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        """The admin API's ``check`` object of a started rollout."""
        return {"running_model": self.running_model, "running_version": self.running_version,
                "signature_changes": list(self.signature_changes)}


def _running(db: FleetDB, group: str) -> tuple[str | None, str | None]:
    release = db.release(group)
    if release is not None:
        return release.model, release.version
    reported = Counter((d.model, d.version) for d in db.devices(group) if d.model)
    return reported.most_common(1)[0][0] if reported else (None, None)


def check_release(repo: ModelRepository, db: FleetDB, name: str, version: str, group: str, *,
                  replace: str | None = None, allow_signature_change: bool = False) -> ReleaseCheck:
    """Refuse (ReleaseCheckError) a push of ``name`` ``version`` to ``group`` that replaces the group's model
    without ``replace`` naming it, or changes its inputs or outputs without ``allow_signature_change``."""
    model, running_version = _running(db, group)
    if model is not None and model != name and replace != model:
        hint = f"--replace {model}" if replace is None else f"--replace {model}, not --replace {replace}"
        raise ReleaseCheckError(f"group {group!r} runs model {model} {running_version}; pushing {name} {version} "
                                f"would replace it with another model on every device: pass {hint} if that is meant")
    if replace is not None and replace != model:
        raise ReleaseCheckError(f"--replace {replace}: group {group!r} runs {model or 'no model yet'}, so there is "
                                f"nothing named {replace} to replace; drop --replace")
    if model is None or running_version is None:
        return ReleaseCheck(None, None)
    try:  # manifests only: a damaged model file is the engine's to refuse (it aborts, naming the file)
        before = read_bundle(repo.path(model, running_version), verify_model=False).manifest
    except NotFoundError:  # the running version left the repository (retention): nothing to compare with
        return ReleaseCheck(model, running_version)
    after = read_bundle(repo.path(name, version), verify_model=False).manifest
    changes = tuple(signature_changes(before.inputs, before.outputs, after.inputs, after.outputs))
    if changes and not allow_signature_change:
        listed = "".join(f"\n  - {change}" for change in changes)
        raise ReleaseCheckError(f"{name} {version} does not take and give what {model} {running_version}, which "
                                f"group {group!r} runs, does:{listed}\nan app that feeds the model breaks on every "
                                "device it reaches: pass --allow-signature-change once the app is ready for it")
    return ReleaseCheck(model, running_version, changes)
