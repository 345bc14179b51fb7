"""The MQTT transport edgesdk's agent and server share (paho-mqtt underneath).

A :class:`Transport` publishes bytes and delivers messages of subscribed topic filters to
handlers. :class:`MqttTransport` reconnects by itself and re-subscribes after every
(re)connect, so a broker restart costs a pause, not a lost subscription; it sets a
retained last will so others see the client go offline. It speaks MQTT 5 so that the
broker says when it refuses something: refused credentials (CONNACK), a refused
subscription (SUBACK) or a publish its ACL denies (PUBACK "Not authorized"; mosquitto 2
grants an ACL-denied subscription and only then drops deliveries, so the publish is what
reveals an agent holding another device's credentials). Each raises or reports a
:class:`BrokerError` instead of leaving a client that is connected but deaf.
"""

from __future__ import annotations

import abc
import json
import logging
import os
import re
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from edgesdk.errors import BrokerError, TransferError
from edgesdk.fleet.burst_client import client_class

__all__ = ["Transport", "MqttTransport", "BrokerAddress", "parse_broker_url", "Handler", "load_credentials",
           "publish_retained"]

log = logging.getLogger(__name__)

#: How long a broker that accepted our socket may leave an MQTT 5 CONNECT unanswered before we try 3.1.1.
_MQTT5_SILENCE_S = 3.0

#: ``$share/<name>/`` before a shared subscription's topic filter (MQTT 5): messages match the filter after it.
_SHARED = re.compile(r"^\$share/[^/]+/")


def _levels(topic_filter: str) -> tuple[str, ...]:
    """A filter's levels as a subscriber matches them (a shared subscription's ``$share/GROUP/`` prefix removed)."""
    return tuple(_SHARED.sub("", topic_filter).split("/"))


def _matches(levels: tuple[str, ...], topic: list[str]) -> bool:
    """Whether a topic (split on ``/``) matches a filter's levels, with MQTT's ``+`` and ``#``: the server runs
    this for every message it receives, so it works on split strings instead of building a matcher per call."""
    for i, level in enumerate(levels):
        if level == "#":
            return True
        if i >= len(topic) or (level != "+" and level != topic[i]):
            return False
    return len(levels) == len(topic)

#: Called as ``handler(topic, payload)`` on the transport's network thread; an exception it raises is logged.
Handler = Callable[[str, bytes], None]


@dataclass(frozen=True)
class BrokerAddress:
    """Where a broker listens, as parsed from its URL."""

    host: str
    port: int
    #: True for ``mqtts://`` (TLS, verified against the CA file given to the transport).
    tls: bool


def parse_broker_url(url: str) -> BrokerAddress:
    """Parse ``mqtt://host[:port]`` (default port 1883) or ``mqtts://host[:port]`` (8883).

    Any other scheme, or no host, raises TransferError.
    """
    parsed = urlparse(url)
    if parsed.scheme not in ("mqtt", "mqtts") or not parsed.hostname:
        raise TransferError(f"broker URL {url!r} must look like mqtt://HOST:PORT or mqtts://HOST:PORT")
    tls = parsed.scheme == "mqtts"
    return BrokerAddress(parsed.hostname, parsed.port or (8883 if tls else 1883), tls)


def load_credentials(path: str | os.PathLike[str], device_id: str | None = None) -> tuple[str, str]:
    """The broker username and password in a credentials file of ``edgesdk server mosquitto-config``.

    With ``device_id`` (an agent), a file naming another device is refused too, since the broker's ACL
    would shut the agent out of its own topics. Raises BrokerError, naming the file and the fix.
    """
    who = device_id or "server"
    fix = f"pass --credentials credentials/{who}.json from `edgesdk server mosquitto-config`"
    try:
        creds = json.loads(Path(path).read_text())
        username, password = creds["username"], creds["password"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BrokerError(f"{path} is not a credentials file with a username and password ({exc}); {fix}") from exc
    if device_id is not None and creds.get("device_id", device_id) != device_id:
        raise BrokerError(f"{path} holds the credentials of device {creds['device_id']!r}, not {device_id!r}; {fix}")
    return str(username), str(password)


class Transport(abc.ABC):
    """Publish/subscribe with QoS 1 delivery; implementations reconnect on their own."""

    @abc.abstractmethod
    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        """Send ``payload`` to ``topic`` without waiting for the broker; see :meth:`confirm_access`."""

    @abc.abstractmethod
    def subscribe(self, topic_filter: str, handler: Handler, qos: int = 1) -> None:
        """Deliver messages matching ``topic_filter`` (MQTT wildcards allowed) to ``handler``, also after reconnects.

        Subscribing the same filter again replaces its handler.
        """

    @abc.abstractmethod
    def unsubscribe(self, topic_filter: str) -> None:
        """Stop delivering messages of ``topic_filter``; an unknown filter is ignored."""

    @abc.abstractmethod
    def close(self) -> None:
        """Disconnect (the broker does not publish the last will) and stop the network thread."""

    @property
    def unacknowledged(self) -> int:
        """QoS 1 messages published and not yet acknowledged by the broker (queued here or in flight); 0 for
        transports that cannot tell."""
        return 0

    @property
    def connection(self) -> int | None:
        """Which of this client's connections (1 for the first) a message published now goes out on; None for
        transports that do not count them."""
        return None

    def confirm_access(self, timeout: float = 10.0) -> None:  # noqa: B027 (optional for transports)
        """Block until the broker answered every subscription and QoS 1 publish so far.

        Raises BrokerError if it refused one. Transports that cannot tell return at once.
        """


class MqttTransport(Transport):
    """A paho-mqtt client running its own network thread.

    The constructor returns once the broker accepted the connection; it raises BrokerError when the
    broker refuses the credentials, TransferError when no broker answers within ``connect_timeout``.
    A refusal seen later (a denied subscription or publish, or refused credentials on a reconnect)
    is kept in :attr:`refusal` and handed to ``on_refused``; with such a hook a client whose
    credentials are refused stops reconnecting, without one it logs the refusal and keeps trying.

    ``will`` is the retained last will (topic, payload), or a function giving the will of each connection from
    its number (1 for the first; see :attr:`connects`), so that a will can name the connection it ends.
    """

    def __init__(self, url: str, client_id: str, username: str | None = None, password: str | None = None,
                 will: tuple[str, bytes] | Callable[[int], tuple[str, bytes]] | None = None,
                 ca_file: str | None = None, keepalive: int = 10,
                 connect_timeout: float = 10.0, on_connect: Callable[[], None] | None = None,
                 on_refused: Callable[[BrokerError], None] | None = None) -> None:
        import paho.mqtt.client as mqtt

        self.address = parse_broker_url(url)
        self._subscriptions: dict[str, tuple[Handler, int, tuple[str, ...]]] = {}
        self._on_connect_hook = on_connect
        self._on_refused_hook = on_refused
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._answered = threading.Event()  # the broker accepted or refused the first connection
        self._subscribed = threading.Condition(self._lock)
        #: Why the broker refused this client (credentials or a subscription), once it did.
        self.refusal: BrokerError | None = None
        self._client_id, self._url, self._username = client_id, url, username
        #: Accepted connections so far (1 after the constructor; each reconnect adds one).
        self.connects = 0
        self._pending_subs: dict[int, str] = {}
        self._pending_pubs: dict[int, str] = {}
        self._early_acks: set[int] = set()  # acknowledged before _track recorded them
        self._unsupported = False
        self._opened_at: float | None = None  # when a socket to the broker first opened
        self._ready = False  # the first connection is settled; later refusals are reported, not raised
        self._will = will
        # MQTT 5 first (it reports refused publishes); a broker that only speaks 3.1.1 gets 3.1.1.
        self._client = self._connect(mqtt.MQTTv5, username, password, ca_file, keepalive)
        if not self._speaks_mqtt5(connect_timeout):
            self._client.loop_stop()
            self._answered.clear()
            self._client = self._connect(mqtt.MQTTv311, username, password, ca_file, keepalive)
            self._answered.wait(connect_timeout)
        if not self._answered.is_set():
            self._client.loop_stop()
            raise TransferError(f"no connection to MQTT broker {url} within {connect_timeout:.0f} s as {client_id!r}; "
                                "check the URL, the broker and the credentials")
        if self.refusal is not None:
            self._client.loop_stop()
            raise self.refusal
        self._ready = True

    def _speaks_mqtt5(self, timeout: float) -> bool:
        """Wait for the answer to our MQTT 5 CONNECT; False when the broker showed it speaks only 3.1.1.

        amqtt refuses some MQTT 5 CONNECTs and leaves others (with a will) unanswered, so a broker that
        accepted the socket but stays silent for a few seconds counts as 3.1.1-only. A broker that is not
        up yet does not: the client keeps trying MQTT 5 until ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while not self._answered.wait(0.1):
            now = time.monotonic()
            if self._opened_at is not None and now - self._opened_at >= _MQTT5_SILENCE_S:
                return False
            if now >= deadline:
                return True  # nothing reached the broker: the caller reports the timeout
        return not self._unsupported

    def _connect(self, protocol: Any, username: str | None, password: str | None, ca_file: str | None,
                 keepalive: int) -> Any:
        import paho.mqtt.client as mqtt

        client = client_class()(callback_api_version=mqtt.CallbackAPIVersion.VERSION2, client_id=self._client_id,
                                protocol=protocol)
        if username is not None:
            client.username_pw_set(username, password)
        self._set_will(client)
        if self.address.tls:
            client.tls_set(ca_certs=ca_file, cert_reqs=ssl.CERT_REQUIRED)
        client.max_inflight_messages_set(64)
        client.max_queued_messages_set(0)
        client.reconnect_delay_set(min_delay=1, max_delay=2)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        client.on_publish = self._on_publish
        client.on_socket_open = self._on_socket_open
        self._opened_at = None
        try:
            if protocol == mqtt.MQTTv5:
                client.connect_async(self.address.host, self.address.port, keepalive=keepalive, clean_start=True)
            else:
                client.connect_async(self.address.host, self.address.port, keepalive=keepalive)
        except (OSError, ValueError) as exc:
            raise TransferError(f"cannot reach MQTT broker {self._url}: {exc}") from exc
        client.loop_start()
        return client

    # paho callbacks run on its network thread
    def _on_socket_open(self, client, userdata, sock):  # type: ignore[no-untyped-def]
        if self._opened_at is None:
            self._opened_at = time.monotonic()

    def _on_connect(self, client, userdata, flags, reason_code, properties=None):  # type: ignore[no-untyped-def]
        if reason_code.is_failure and client.protocol == 5 and reason_code.value in (1, 132):  # needs 3.1.1
            self._unsupported = True
            client.disconnect()
            self._answered.set()
            return
        if reason_code.is_failure:
            self._refuse(BrokerError(
                f"MQTT broker {self._url} refused {self._client_id!r} (user {self._username!r}): {reason_code}; "
                "check --credentials (from `edgesdk server mosquitto-config`) and the device id"))
            # Retrying the same credentials gets the same answer: stop, unless nobody would hear of it
            # (a server keeps trying until the broker's password file is fixed).
            if not self._ready or self._on_refused_hook is not None:
                client.disconnect()
            self._answered.set()
            return
        with self._lock:
            subscriptions = dict(self._subscriptions)
            self._pending_subs.clear()  # SUBSCRIBEs in flight died with the old connection; all are re-sent
        for topic_filter, (_, qos, _) in subscriptions.items():
            self._send_subscribe(topic_filter, qos)
        self.connects += 1
        self._connected.set()
        self._answered.set()
        if self._on_connect_hook is not None:
            self._on_connect_hook()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties=None):  # type: ignore[no-untyped-def]
        self._connected.clear()
        self._set_will(client)  # paho sends the will it holds with its next CONNECT

    def _set_will(self, client: Any) -> None:
        """Give ``client`` the will of the connection it makes next."""
        if self._will is not None:
            topic, payload = self._will(self.connects + 1) if callable(self._will) else self._will
            client.will_set(topic, payload, qos=1, retain=True)

    def _acked(self, pending: dict[int, str], mid: int) -> str:
        """Forget an acknowledged mid (or note that it came before :meth:`_track` recorded it)."""
        with self._lock:
            topic = pending.pop(mid, None)
            if topic is None:
                self._early_acks.add(mid)
            self._subscribed.notify_all()
        return topic or "a topic"

    def _track(self, pending: dict[int, str], mid: int | None, topic: str) -> None:
        # Called after paho returns, never holding our lock across a paho call: paho runs our callbacks
        # while holding its own locks, so holding ours while calling into it could deadlock.
        if not mid:
            return
        with self._lock:
            if mid in self._early_acks:
                self._early_acks.discard(mid)
            else:
                pending[mid] = topic

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties=None):  # type: ignore[no-untyped-def]
        topic = self._acked(self._pending_subs, mid)
        if any(code.is_failure for code in reason_codes):
            self._refuse(BrokerError(
                f"MQTT broker {self._url} refused the subscription of {self._client_id!r} (user {self._username!r}) "
                f"to {topic}: the broker's ACL does not allow it; the credentials belong to another device, or the "
                "ACL lacks this device (regenerate it with `edgesdk server mosquitto-config`)"))

    def _on_publish(self, client, userdata, mid, reason_code, properties=None):  # type: ignore[no-untyped-def]
        topic = self._acked(self._pending_pubs, mid)
        if reason_code.is_failure:
            self._refuse(BrokerError(
                f"MQTT broker {self._url} refused a publish of {self._client_id!r} (user {self._username!r}) to "
                f"{topic}: {reason_code}; the credentials belong to another device, or the broker's ACL lacks this "
                "one (regenerate it with `edgesdk server mosquitto-config`)"))

    def _refuse(self, error: BrokerError) -> None:
        """Record the first refusal; hand it to ``on_refused``, or log it when nobody will raise it."""
        if self.refusal is not None:
            return
        self.refusal = error
        if self._on_refused_hook is not None:
            self._on_refused_hook(error)
        elif self._ready:
            log.error("%s", error)

    def _on_message(self, client, userdata, message):  # type: ignore[no-untyped-def]
        topic = message.topic.split("/")
        with self._lock:
            handlers = [h for h, _, levels in self._subscriptions.values() if _matches(levels, topic)]
        for handler in handlers:
            try:
                handler(message.topic, message.payload)
            except Exception:  # a handler bug must not kill the network thread
                log.exception("handler for %s failed", message.topic)

    def _send_subscribe(self, topic_filter: str, qos: int) -> None:
        result, mid = self._client.subscribe(topic_filter, qos)
        self._track(self._pending_subs, mid, topic_filter)

    def confirm_access(self, timeout: float = 10.0) -> None:
        """Block until the broker answered every subscription and QoS 1 publish so far.

        Raises BrokerError if it refused one (also one refused earlier), TransferError when the
        answers take longer than ``timeout`` seconds.
        """

        def answered() -> bool:
            return (not self._pending_subs and not self._pending_pubs) or self.refusal is not None

        with self._lock:
            if not self._subscribed.wait_for(answered, timeout):
                raise TransferError(f"MQTT broker {self._url} did not acknowledge "
                                    f"{sorted({*self._pending_subs.values(), *self._pending_pubs.values()})} "
                                    f"within {timeout:g} s")
        if self.refusal is not None:
            raise self.refusal

    @property
    def unacknowledged(self) -> int:
        """QoS 1 publishes the broker has not acknowledged yet: paho sends at most 64 at a time and queues the
        rest, so a burst of thousands leaves the process over seconds."""
        with self._lock:
            return len(self._pending_pubs)

    @property
    def connection(self) -> int:
        """Which connection a message published now goes out on: the current one, or while the link is down the
        reconnect's (paho sends it after the reconnect)."""
        return self.connects if self.connected else self.connects + 1

    @property
    def connected(self) -> bool:
        """True while the client holds an accepted connection; False between a drop and the reconnect."""
        return self._connected.is_set()

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        """Queue ``payload`` for ``topic`` and return; safe from any thread, a handler included.

        QoS 1 messages published while disconnected go out after the reconnect.
        """
        info = self._client.publish(topic, payload, qos=qos, retain=retain)
        if qos:
            self._track(self._pending_pubs, info.mid, topic)

    def subscribe(self, topic_filter: str, handler: Handler, qos: int = 1) -> None:
        """Deliver messages matching ``topic_filter`` to ``handler`` from now on and after every reconnect.

        Returns before the broker answers; :meth:`confirm_access` waits for it. Subscribing the same
        filter again replaces its handler.
        """
        with self._lock:
            self._subscriptions[topic_filter] = (handler, qos, _levels(topic_filter))
        if self.connected:
            self._send_subscribe(topic_filter, qos)

    def unsubscribe(self, topic_filter: str) -> None:
        """Stop delivering ``topic_filter`` and keep it out of re-subscriptions after reconnects."""
        with self._lock:
            self._subscriptions.pop(topic_filter, None)
        self._client.unsubscribe(topic_filter)

    def close(self) -> None:
        """Disconnect cleanly (no last will is published) and stop the network thread."""
        self._client.disconnect()
        self._client.loop_stop()


def publish_retained(broker_url: str, topic: str, payload: bytes) -> None:
    """Publish ``payload`` retained on ``topic`` with a short-lived client of its own (as an operator's tool would),
    and return once the broker has taken it."""
    transport = MqttTransport(broker_url, client_id=f"operator-{time.monotonic_ns()}")
    try:
        transport.publish(topic, payload, retain=True)
        transport.confirm_access()
    finally:
        transport.close()
