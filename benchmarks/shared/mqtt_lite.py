"""A minimal asyncio MQTT 3.1.1 client for load tools: thousands of connections on one event loop.

Each client is an :class:`asyncio.Protocol` (no task or thread per connection): CONNECT with a
retained will, SUBSCRIBE, UNSUBSCRIBE, PUBLISH QoS 0/1 both ways (incoming QoS 1 is acknowledged,
outgoing QoS 1 returns a future the PUBACK resolves), PINGREQ on a timer, DISCONNECT. No QoS 2,
no session resumption (clean session only), no TLS: it is for loopback benchmarks and tests.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

from edgesdk.errors import BrokerError, TransferError

__all__ = ["LiteClient", "LiteCounters"]

_CONNECT, _CONNACK, _PUBLISH, _PUBACK = 1, 2, 3, 4
_SUBSCRIBE, _SUBACK, _UNSUBSCRIBE, _UNSUBACK = 8, 9, 10, 11
_PINGREQ, _PINGRESP, _DISCONNECT = 12, 13, 14


def _length(n: int) -> bytes:
    """MQTT's variable-length remaining-length field."""
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | 0x80 if n else byte)
        if not n:
            return bytes(out)


def _text(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack("!H", len(raw)) + raw


def _packet(kind: int, flags: int, body: bytes) -> bytes:
    return bytes([kind << 4 | flags]) + _length(len(body)) + body


class LiteCounters:
    """Messages and payload bytes in and out, shared by every client of one process."""

    __slots__ = ("messages_in", "messages_out", "bytes_in", "bytes_out")

    def __init__(self) -> None:
        self.messages_in = self.messages_out = self.bytes_in = self.bytes_out = 0


#: Called with (topic, payload) for every PUBLISH the broker delivers.
MessageHandler = Callable[[str, bytes], None]


class LiteClient(asyncio.Protocol):
    """One MQTT 3.1.1 connection; make it, then ``await connect(host, port)``.

    ``on_lost`` is called (with no argument) when an established connection drops without
    :meth:`disconnect`; the owner decides whether to connect a new client.
    """

    def __init__(self, client_id: str, on_message: MessageHandler, *, keepalive: int = 60,
                 will: tuple[str, bytes] | None = None, counters: LiteCounters | None = None,
                 on_lost: Callable[[], None] | None = None) -> None:
        self.client_id, self.keepalive, self.will = client_id, keepalive, will
        self.on_message, self.on_lost = on_message, on_lost
        self.counters = counters or LiteCounters()
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._next_id = 0
        self._waiting: dict[int, asyncio.Future[bytes]] = {}
        self._connack: asyncio.Future[int] | None = None
        self._ping: asyncio.TimerHandle | None = None
        self._closing = False

    # connection ------------------------------------------------------------------------------
    async def connect(self, host: str, port: int, timeout: float = 10.0) -> None:
        """Open the socket, send CONNECT (clean session) and wait for CONNACK.

        Raises BrokerError when the broker refuses the client, OSError when the socket does not open,
        TransferError when no CONNACK comes within ``timeout``.
        """
        loop = asyncio.get_running_loop()
        self._connack = loop.create_future()
        await loop.create_connection(lambda: self, host, port)
        flags = 0x02
        payload = _text(self.client_id)
        if self.will is not None:
            flags |= 0x04 | 0x08 | 0x20  # will, will QoS 1, will retained (as the real agent's)
            payload += _text(self.will[0]) + _text(self.will[1])
        body = _text("MQTT") + bytes([4, flags]) + struct.pack("!H", self.keepalive) + payload
        self._send(_packet(_CONNECT, 0, body))
        try:
            code = await asyncio.wait_for(self._connack, timeout)
        except asyncio.TimeoutError:
            self.abort()
            raise TransferError(f"no CONNACK for {self.client_id!r} within {timeout:g} s; is the broker overloaded "
                                "or at its connection limit (LocalMosquitto(max_open_files=...))?") from None
        if code != 0:
            self.abort()
            raise BrokerError(f"the broker refused client {self.client_id!r} with CONNACK code {code}; check its "
                              "listener and allow_anonymous settings")
        self._schedule_ping()

    async def disconnect(self) -> None:
        """Send DISCONNECT (the broker drops the will) and close the socket."""
        self._closing = True
        if self._transport is not None and not self._transport.is_closing():
            self._send(_packet(_DISCONNECT, 0, b""))
            self._transport.close()

    def abort(self) -> None:
        """Drop the socket at once, without DISCONNECT: the broker publishes the will."""
        self._closing = True
        if self._transport is not None:
            self._transport.abort()

    @property
    def connected(self) -> bool:
        """True while the socket is open and CONNACK accepted it."""
        return (self._transport is not None and not self._transport.is_closing() and self._connack is not None
                and self._connack.done() and not self._connack.cancelled() and self._connack.exception() is None)

    # operations -----------------------------------------------------------------------------
    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> asyncio.Future[bytes] | None:
        """Send a PUBLISH; for QoS 1 a future the broker's PUBACK resolves (None for QoS 0)."""
        head = _text(topic)
        future = None
        if qos:
            packet_id, future = self._new_id()
            head += struct.pack("!H", packet_id)
        self._send(_packet(_PUBLISH, qos << 1 | int(retain), head + payload))
        self.counters.messages_out += 1
        self.counters.bytes_out += len(payload)
        return future

    def subscribe(self, filters: list[tuple[str, int]]) -> asyncio.Future[bytes]:
        """Send SUBSCRIBE for (filter, qos) pairs; the future's result is SUBACK's return codes."""
        packet_id, future = self._new_id()
        body = struct.pack("!H", packet_id) + b"".join(_text(f) + bytes([q]) for f, q in filters)
        self._send(_packet(_SUBSCRIBE, 0x02, body))
        return future

    def unsubscribe(self, filters: list[str]) -> asyncio.Future[bytes]:
        """Send UNSUBSCRIBE; the future resolves on UNSUBACK."""
        packet_id, future = self._new_id()
        self._send(_packet(_UNSUBSCRIBE, 0x02, struct.pack("!H", packet_id) + b"".join(_text(f) for f in filters)))
        return future

    def _new_id(self) -> tuple[int, asyncio.Future[bytes]]:
        self._next_id = self._next_id % 65535 + 1
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting[self._next_id] = future
        return self._next_id, future

    def _send(self, data: bytes) -> None:
        if self._transport is None or self._transport.is_closing():
            raise TransferError(f"client {self.client_id!r} is not connected; connect it again before sending")
        self._transport.write(data)

    def _schedule_ping(self) -> None:
        if self.keepalive and not self._closing:
            self._ping = asyncio.get_running_loop().call_later(self.keepalive * 0.75, self._send_ping)

    def _send_ping(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(_packet(_PINGREQ, 0, b""))
            self._schedule_ping()

    # asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport (asyncio calls this once the socket is open)."""
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail what waits on the broker and tell the owner, unless we closed on purpose."""
        if self._ping is not None:
            self._ping.cancel()
        error = TransferError(f"connection of {self.client_id!r} to the broker was lost ({exc or 'closed'})")
        for future in [*self._waiting.values(), self._connack]:
            if future is not None and not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: nobody may be awaiting it any more
        self._waiting.clear()
        connack = self._connack
        was_up = (connack is not None and connack.done() and not connack.cancelled() and connack.exception() is None
                  and connack.result() == 0)
        if not self._closing and was_up and self.on_lost is not None:
            self.on_lost()
        self._closing = True

    def data_received(self, data: bytes) -> None:
        """Parse whole packets out of the stream and handle each."""
        buffer = self._buffer
        buffer += data
        while len(buffer) >= 2:
            length, multiplier, pos = 0, 1, 1
            while True:
                if pos >= len(buffer):
                    return  # the length field itself is incomplete
                byte = buffer[pos]
                length += (byte & 0x7F) * multiplier
                multiplier *= 128
                pos += 1
                if not byte & 0x80:
                    break
            end = pos + length
            if len(buffer) < end:
                return
            header, body = buffer[0], bytes(buffer[pos:end])
            del buffer[:end]
            self._handle(header >> 4, header & 0x0F, body)

    def _handle(self, kind: int, flags: int, body: bytes) -> None:
        if kind == _PUBLISH:
            (topic_len,) = struct.unpack_from("!H", body)
            topic = body[2:2 + topic_len].decode()
            pos = 2 + topic_len
            qos = (flags >> 1) & 0x03
            if qos:
                packet_id = body[pos:pos + 2]
                pos += 2
                if self._transport is not None and not self._transport.is_closing():
                    self._transport.write(bytes([_PUBACK << 4, 2]) + packet_id)
            payload = body[pos:]
            self.counters.messages_in += 1
            self.counters.bytes_in += len(payload)
            self.on_message(topic, payload)
        elif kind in (_PUBACK, _SUBACK, _UNSUBACK):
            (packet_id,) = struct.unpack_from("!H", body)
            future = self._waiting.pop(packet_id, None)
            if future is not None and not future.done():
                future.set_result(body[2:])
        elif kind == _CONNACK:
            if self._connack is not None and not self._connack.done():
                self._connack.set_result(body[1])
        # PINGRESP needs nothing: a dead broker shows as a lost connection
