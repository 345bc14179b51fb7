"""Who sent a request to the admin address, and how many wrong admin tokens it may try: shared by the admin API and
the console, so a lockout earned on one holds on the other.

- **Proxies.** ``X-Forwarded-Proto`` and ``X-Forwarded-For`` are believed only from the proxies the operator names
  (``edgesdk server --behind-proxy ADDRESSES``: IPs or networks, or ``*``). From anyone else they are ignored: the
  client is the connection's peer and the scheme is the connection's own.
- **Lockout.** Each client (its address, or the forwarded one behind a trusted proxy) may get the admin token wrong
  :attr:`LoginLimiter.free` times (5), on the console's login or in the API's ``Authorization`` header alike; every
  failure after that locks it out, for twice as long as the one before (30 s, 1 min, 2 min, ... up to an hour). A
  locked-out client gets 429 with ``Retry-After`` whatever it sends, the right token included; a right token resets
  its count. Counts live in this process (each replica keeps its own).
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgesdk.errors import EdgeSDKError

__all__ = ["Proxies", "LoginLimiter"]

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _network(text: str) -> _Network:
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise EdgeSDKError(f"trusted proxy {text.strip()!r} is not an IP address or network; give addresses like "
                           "127.0.0.1,10.0.0.0/8 (or * to trust every peer)") from None


@dataclass(frozen=True)
class Proxies:
    """The reverse proxies whose forwarding headers the console believes (none by default).

    ``spec`` is a comma-separated list of IP addresses and networks, or ``*`` for every peer (only when nothing but
    the proxy can reach the server's port; the client is then the first ``X-Forwarded-For`` hop, which the proxy
    must overwrite, not append to).
    """

    spec: str = ""
    _networks: tuple[_Network, ...] = field(init=False, repr=False, compare=False)
    _any: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        entries = [e for e in self.spec.split(",") if e.strip()]
        every = any(e.strip() == "*" for e in entries)
        object.__setattr__(self, "_any", every)
        object.__setattr__(self, "_networks", () if every else tuple(_network(e) for e in entries))

    def trusts(self, host: str | None) -> bool:
        """Whether ``host`` (a peer address) is one of the trusted proxies."""
        if self._any:
            return host is not None
        try:
            address = ipaddress.ip_address(host or "")
        except ValueError:
            return False
        return any(address in network for network in self._networks)

    def client(self, request: Any) -> str:
        """The client's address: the peer's, or behind trusted proxies the last ``X-Forwarded-For`` hop they did not
        add themselves (a client can prepend anything; only what the trusted proxies appended counts)."""
        peer = request.client.host if request.client else "unknown"
        if not self.trusts(peer):
            return peer
        hops = [h.strip()[:64] for value in request.headers.getlist("x-forwarded-for") for h in value.split(",")]
        hops = [h for h in hops if h]
        if self._any:  # every peer is a proxy: the first hop is all there is to go on
            return hops[0] if hops else peer
        for hop in reversed(hops):
            if not self.trusts(hop):
                return hop
        return peer

    def https(self, request: Any) -> bool:
        """Whether the client reached the console over HTTPS: the connection's scheme, or a trusted proxy's
        ``X-Forwarded-Proto: https``."""
        if request.url.scheme == "https":
            return True
        peer = request.client.host if request.client else None
        return self.trusts(peer) and request.headers.get("x-forwarded-proto", "").strip().lower() == "https"


@dataclass
class _Record:
    failures: int = 0
    locked_until: float = 0.0
    last: float = 0.0


class LoginLimiter:
    """Wrong-token counts and lockouts per client (see the module's docstring); safe to call from any thread.

    ``free`` failures are allowed; failure ``free + k`` (k >= 1) locks the client out for ``base_s * 2**(k - 1)``
    seconds, at most ``max_s``. A client quiet for ``max_s`` after its last failure (and not locked) starts again
    from zero; at most ``max_clients`` are remembered (the longest quiet are forgotten first).
    """

    def __init__(self, free: int = 5, base_s: float = 30.0, max_s: float = 3600.0, max_clients: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if free < 1 or not 0 < base_s <= max_s or max_clients < 1:
            raise EdgeSDKError(f"LoginLimiter(free={free}, base_s={base_s}, max_s={max_s}, max_clients={max_clients}):"
                               " give free >= 1, 0 < base_s <= max_s and max_clients >= 1")
        self.free, self.base_s, self.max_s, self.max_clients = free, base_s, max_s, max_clients
        self._clock = clock
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, client: str) -> float:
        """Seconds ``client`` stays locked out (0: it may try now)."""
        with self._lock:
            record = self._records.get(client)
            return max(0.0, record.locked_until - self._clock()) if record else 0.0

    def failed(self, client: str) -> float:
        """Count a wrong token from ``client``; the lockout it starts, in seconds (0: none yet)."""
        now = self._clock()
        with self._lock:
            record = self._records.pop(client, None)
            if record is None or (record.locked_until <= now and now - record.last > self.max_s):
                record = _Record()
            record.failures += 1
            record.last = now
            lockout = 0.0
            if record.failures > self.free:
                lockout = min(self.max_s, self.base_s * 2.0 ** min(record.failures - self.free - 1, 64))
                record.locked_until = now + lockout
            self._records[client] = record
            self._prune(now)
            return lockout

    def succeeded(self, client: str) -> None:
        """A right token from ``client``: forget its failures."""
        with self._lock:
            self._records.pop(client, None)

    def _prune(self, now: float) -> None:
        if len(self._records) <= self.max_clients:
            return
        for client in [c for c, r in self._records.items() if r.locked_until <= now and now - r.last > self.max_s]:
            del self._records[client]
        while len(self._records) > self.max_clients:
            self._records.popitem(last=False)
