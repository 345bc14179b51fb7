"""The MQTT transport edgesdk's agent and server share (paho-mqtt underneath).

A :class:`Transport` publishes bytes and delivers messages of subscribed topic filters to
handlers. :class:`MqttTransport` reconnects by itself and re-subscribes after every
(re)connect, so a broker restart costs a pause, not a lost subscription; it sets a
retained last will so others see the client go offline.
"""

from __future__ import annotations

import abc
import logging
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlparse

from edgesdk.errors import TransferError

__all__ = ["Transport", "MqttTransport", "BrokerAddress", "parse_broker_url", "Handler"]

log = logging.getLogger(__name__)

Handler = Callable[[str, bytes], None]


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int
    tls: bool


def parse_broker_url(url: str) -> BrokerAddress:
    """``mqtt://host:1883`` or ``mqtts://host:8883``."""
    parsed = urlparse(url)
    if parsed.scheme not in ("mqtt", "mqtts") or not parsed.hostname:
        raise TransferError(f"broker URL {url!r} must look like mqtt://HOST:PORT or mqtts://HOST:PORT")
    tls = parsed.scheme == "mqtts"
    return BrokerAddress(parsed.hostname, parsed.port or (8883 if tls else 1883), tls)


class Transport(abc.ABC):
    """Publish/subscribe with QoS 1 delivery; implementations reconnect on their own."""

    @abc.abstractmethod
    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None: ...

    @abc.abstractmethod
    def subscribe(self, topic_filter: str, handler: Handler, qos: int = 1) -> None: ...

    @abc.abstractmethod
    def unsubscribe(self, topic_filter: str) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...


class MqttTransport(Transport):
    """A paho-mqtt client running its own network thread."""

    def __init__(self, url: str, client_id: str, username: str | None = None, password: str | None = None,
                 will: tuple[str, bytes] | None = None, ca_file: str | None = None, keepalive: int = 10,
                 connect_timeout: float = 10.0, on_connect: Callable[[], None] | None = None) -> None:
        import paho.mqtt.client as mqtt

        self.address = parse_broker_url(url)
        self._subscriptions: dict[str, tuple[Handler, int]] = {}
        self._on_connect_hook = on_connect
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self.connects = 0
        client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                             protocol=mqtt.MQTTv311, clean_session=True)
        if username is not None:
            client.username_pw_set(username, password)
        if will is not None:
            client.will_set(will[0], will[1], qos=1, retain=True)
        if self.address.tls:
            client.tls_set(ca_certs=ca_file, cert_reqs=ssl.CERT_REQUIRED)
        client.max_inflight_messages_set(64)
        client.max_queued_messages_set(0)
        client.reconnect_delay_set(min_delay=1, max_delay=2)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        self._pending_subs: dict[int, str] = {}
        self._client = client
        try:
            client.connect_async(self.address.host, self.address.port, keepalive=keepalive)
        except (OSError, ValueError) as exc:
            raise TransferError(f"cannot reach MQTT broker {url}: {exc}") from exc
        client.loop_start()
        if not self._connected.wait(connect_timeout):
            client.loop_stop()
            raise TransferError(f"no connection to MQTT broker {url} within {connect_timeout:.0f} s as {client_id!r}; "
                                "check the URL, the broker and the credentials")

    # paho callbacks run on its network thread
    def _on_connect(self, client, userdata, flags, reason_code, properties=None):  # type: ignore[no-untyped-def]
        if reason_code.is_failure:
            log.warning("MQTT connect refused: %s", reason_code)
            return
        with self._lock:
            subscriptions = dict(self._subscriptions)
        for topic_filter, (_, qos) in subscriptions.items():
            self._send_subscribe(topic_filter, qos)
        self.connects += 1
        self._connected.set()
        if self._on_connect_hook is not None:
            self._on_connect_hook()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties=None):  # type: ignore[no-untyped-def]
        self._connected.clear()

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties=None):  # type: ignore[no-untyped-def]
        topic = self._pending_subs.pop(mid, "?")
        if any(code.is_failure for code in reason_codes):
            log.warning("broker refused subscription to %s", topic)

    def _on_message(self, client, userdata, message):  # type: ignore[no-untyped-def]
        import paho.mqtt.client as mqtt

        with self._lock:
            handlers = [h for f, (h, _) in self._subscriptions.items() if mqtt.topic_matches_sub(f, message.topic)]
        for handler in handlers:
            try:
                handler(message.topic, message.payload)
            except Exception:  # a handler bug must not kill the network thread
                log.exception("handler for %s failed", message.topic)

    def _send_subscribe(self, topic_filter: str, qos: int) -> None:
        result, mid = self._client.subscribe(topic_filter, qos)
        if mid is not None:
            self._pending_subs[mid] = topic_filter

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        # Queued by paho while disconnected and sent after reconnecting.
        self._client.publish(topic, payload, qos=qos, retain=retain)

    def subscribe(self, topic_filter: str, handler: Handler, qos: int = 1) -> None:
        with self._lock:
            self._subscriptions[topic_filter] = (handler, qos)
        if self.connected:
            self._send_subscribe(topic_filter, qos)

    def unsubscribe(self, topic_filter: str) -> None:
        with self._lock:
            self._subscriptions.pop(topic_filter, None)
        self._client.unsubscribe(topic_filter)

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()
