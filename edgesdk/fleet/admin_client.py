"""A small client for the OTA server's admin API (stdlib urllib: no web framework on devices).

Fleet answers come back as the records of :mod:`edgesdk.fleet.records`, converted from
the API's JSON here and nowhere else.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from edgesdk import errors
from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.records import DeviceRecord, GroupRelease, RolloutPolicy, RolloutRecord, RolloutSummary, parse_time

__all__ = ["AdminClient", "DevicePage", "Provisioned"]


#: The class for an HTTP status when the server's ``type`` is not in edgesdk.errors (a server-side subclass).
_BY_STATUS: dict[int, type[EdgeSDKError]] = {404: errors.NotFoundError, 409: errors.ConflictError}


def _error_class(name: object, status: int) -> type[EdgeSDKError]:
    """The edgesdk error class the server named (its ``type`` field), so callers can tell errors apart."""
    found = getattr(errors, name, None) if isinstance(name, str) else None
    if isinstance(found, type) and issubclass(found, EdgeSDKError):
        return found
    return _BY_STATUS.get(status, EdgeSDKError)


@dataclass(frozen=True)
class DevicePage:
    """A page of ``GET /api/devices``: the devices, how many match in all, and the id to continue after."""

    devices: list[DeviceRecord]
    total: int
    #: Pass as ``after`` for the next page; None on the last page.
    next: str | None


@dataclass(frozen=True)
class Provisioned:
    """The group a device is provisioned in (``GET /api/provisioning``): who put it there, and when."""

    device_id: str
    group: str
    #: ``devices file``, ``admin api`` or ``first report`` (the device named its group and nobody had placed it).
    source: str
    updated: float

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Provisioned:
        """One entry of the API's answer."""
        return cls(str(data["device_id"]), str(data["group"]), str(data["source"]), parse_time(data["updated"]))


def _rollback_body(to: str | None, all_at_once: bool) -> dict[str, Any] | None:
    """The body of a rollback request (None: empty, the server's defaults)."""
    body = {**({"to": to} if to else {}), **({"all_at_once": True} if all_at_once else {})}
    return body or None


def _query(**params: Any) -> str:
    """``?a=1&b=x`` of the parameters that are not None (empty when none is)."""
    given = {k: v for k, v in params.items() if v is not None}
    return "?" + urllib.parse.urlencode(given) if given else ""


class AdminClient:
    """Calls the OTA server's admin API with a bearer token; a refusal raises the server's error class."""

    def __init__(self, url: str, token: str, timeout: float = 60.0) -> None:
        """``url`` of the server (``http://host:port``), its admin ``token``, and a per-request ``timeout`` in s."""
        if not token:
            raise EdgeSDKError("no admin token: `edgesdk server` writes admin.token beside its --db; pass "
                               "--token-file PATH to that file (or --token TOKEN), or set EDGESDK_TOKEN_FILE "
                               "(or EDGESDK_TOKEN)")
        self.url, self.token, self.timeout = url.rstrip("/"), token, timeout

    def _call(self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json") -> Any:
        request = urllib.request.Request(f"{self.url}{path}", data=body, method=method,
                                         headers={"Authorization": f"Bearer {self.token}", "Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                answer = json.loads(exc.read())
                message, kind = answer.get("error", exc.reason), answer.get("type")
            except (ValueError, AttributeError):
                message, kind = exc.reason, None
            raise _error_class(kind, exc.code)(f"server answered {exc.code}: {message}") from None
        except urllib.error.URLError as exc:
            raise EdgeSDKError(f"cannot reach the OTA server at {self.url}: {exc.reason}") from None

    def _json(self, method: str, path: str, data: Any = None) -> Any:
        return self._call(method, path, json.dumps(data).encode() if data is not None else None)

    def upload(self, archive: bytes) -> dict[str, Any]:
        """Store a bundle tar; ``{"name", "version", "stored"}`` (``stored`` False: the identical bundle was there)."""
        return self._call("POST", "/api/bundles", archive, "application/x-tar")

    def start_rollout(self, name: str, version: str, group: str, policy: RolloutPolicy, *,
                      replace: str | None = None, allow_signature_change: bool = False) -> str:
        """Start rolling ``name`` ``version`` out to ``group`` under ``policy``; the rollout id (see
        :meth:`start_release` for what else the server answers)."""
        return str(self.start_release(name, version, group, policy, replace=replace,
                                      allow_signature_change=allow_signature_change)["id"])

    def start_release(self, name: str, version: str, group: str, policy: RolloutPolicy, *,
                      replace: str | None = None, allow_signature_change: bool = False) -> dict[str, Any]:
        """Start a rollout and return the server's whole answer: ``id``; ``plan``, ``[{"percent", "devices",
        "added", "collapsed"}]`` per stage asked for (a collapsed wave added no device); ``check``, the model and
        version the group ran and how the inputs and outputs change; ``artifacts``, the boards the release has a
        bundle for; ``no_artifact``, how many devices have none for their board. A ReleaseCheckError when the push
        replaces the group's model without ``replace`` naming it, or changes its inputs or outputs without
        ``allow_signature_change``: then nothing was sent."""
        answer = self._json("POST", "/api/rollouts", {"name": name, "version": version, "group": group,
                                                      "policy": policy.to_dict(), "replace": replace,
                                                      "allow_signature_change": allow_signature_change})
        return {"plan": [], "check": {}, "artifacts": [], "no_artifact": 0, **answer}

    def rollout(self, rollout_id: str, *, limit: int | None = None, after: str | None = None,
                stage: int | None = None, status: str | None = None) -> RolloutRecord:
        """One rollout with its counts and a page of its targets (NotFoundError for an unknown id).

        ``limit`` targets (the server's default page without it; 0 for none) after device ``after``,
        of ``stage`` (the record's 0-based index; the API numbers stages from 1) and in ``status`` if given;
        ``targets_total`` says how many there are.
        """
        query = _query(limit=limit, after=after, stage=None if stage is None else stage + 1, status=status)
        return RolloutRecord.from_json(self._json("GET", f"/api/rollouts/{urllib.parse.quote(rollout_id, safe='')}"
                                                         f"{query}"))

    def rollouts(self) -> list[RolloutSummary]:
        """Every rollout, oldest first."""
        return [RolloutSummary.from_json(r) for r in self._json("GET", "/api/rollouts")]

    def act(self, rollout_id: str, action: str, to: str | None = None, *,
            all_at_once: bool = False) -> str:
        """``promote``, ``abort``, ``rollback`` or ``resume`` a rollout; the id of the rollout to
        follow.

        For ``rollback`` (to version ``to``: one the group ran, older than what it runs; None: the
        most recent such) that is the new rollout sending the old version, staged with the
        rolled-back rollout's policy, or with ``all_at_once`` to every device at once without
        analysis; else ``rollout_id``. A refusal of the rollback rules is a ConflictError naming
        the versions the group may go to.
        """
        answer = self._json("POST", f"/api/rollouts/{urllib.parse.quote(rollout_id, safe='')}/{action}",
                            _rollback_body(to, all_at_once))
        return str(answer["id"])

    def rollback_group(self, group: str, to: str | None = None, *,
                       all_at_once: bool = False) -> str:
        """Roll ``group`` back (its running rollout, else its release) to version ``to``, else the
        most recent version it ran before, as :meth:`act` does; the rollback rollout's id."""
        answer = self._json("POST", f"/api/groups/{urllib.parse.quote(group, safe='')}/rollback",
                            _rollback_body(to, all_at_once))
        return str(answer["id"])

    def resume(self, rollout_id: str) -> str:
        """Let a flagged release's catch-up go on (late devices are sent it again); the flag's
        reason it cleared. A ConflictError when the rollout is not flagged, or no longer its
        group's release."""
        path = f"/api/rollouts/{urllib.parse.quote(rollout_id, safe='')}/resume"
        answer = self._json("POST", path)
        return str(answer["flag"])

    def device_page(self, group: str | None = None, *, status: str | None = None, after: str | None = None,
                    limit: int | None = None) -> DevicePage:
        """One page of devices by id (of ``group``, in ``status``), starting after id ``after``."""
        page = self._json("GET", f"/api/devices{_query(group=group, status=status, after=after, limit=limit)}")
        return DevicePage([DeviceRecord.from_json(d) for d in page["devices"]], int(page["total"]), page.get("next"))

    def devices(self, group: str | None = None, status: str | None = None) -> list[DeviceRecord]:
        """Every device (of ``group``, in ``status``) as it last reported, fetched page by page."""
        found: list[DeviceRecord] = []
        after = None
        while True:
            page = self.device_page(group, status=status, after=after)
            found += page.devices
            if page.next is None:
                return found
            after = page.next

    def groups(self) -> list[GroupRelease]:
        """Each group's release (desired state) and how many of its devices run it, by group."""
        return [GroupRelease.from_json(g) for g in self._json("GET", "/api/groups")]

    def provision(self, devices: dict[str, str], source: str = "admin api") -> list[str]:
        """Put devices in groups (device id -> group), saying where the groups come from (``source``); the
        devices that moved from another group. A device's agent must then name that group (``--group``)."""
        return list(self._json("POST", "/api/provisioning", {"devices": devices, "source": source})["moved"])

    def set_group(self, device_id: str, group: str) -> bool:
        """Put one device in ``group``; True if it moved there from another group."""
        path = f"/api/devices/{urllib.parse.quote(device_id, safe='')}/group"
        return bool(self._json("PUT", path, {"group": group})["moved"])

    def provisioning(self, group: str | None = None) -> list[Provisioned]:
        """Every provisioned device (of ``group``), by id."""
        return [Provisioned.from_json(p) for p in self._json("GET", f"/api/provisioning{_query(group=group)}")]

    def request_measurement(self, device: str, archive: bytes, mode: str, runs: int,
                            timeout_s: float | None = None) -> str:
        """Have ``device`` measure the model in ``archive`` (:func:`edgesdk.fleet.measurement.pack_measurement`); its id."""
        query = urllib.parse.urlencode({"device": device, "mode": mode, "runs": runs,
                                        **({"timeout": timeout_s} if timeout_s is not None else {})})
        return self._call("POST", f"/api/measurements?{query}", archive, "application/x-tar")["id"]

    def measurement(self, measurement_id: str) -> dict[str, Any]:
        """A measurement's status; ``figures`` and ``outputs`` (base64 ``.npy``) once it is ``done``."""
        return self._json("GET", f"/api/measurements/{urllib.parse.quote(measurement_id, safe='')}")
