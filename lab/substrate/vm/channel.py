"""Host side of the agent protocol: JSON lines over QEMU's virtio-serial unix socket.

One connection carries many requests at once: each gets a unique id, a reader thread hands every
reply to the request waiting for that id, and replies for ids this client never sent (left over
from a previous client of the same port) are dropped. QEMU's socket chardev takes one client at a
time; a new one may connect after the previous has closed.

Each connection starts with {"op": "hello"}. A stream (open_stream) gets many messages for its
id: they go to its own queue, in order, until the one with "done" (or "error"). Control messages
(post) are sent without an id and get no reply.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import socket
import threading
from pathlib import Path

from lab.core.errors import StartupError


class ChannelClosed(StartupError):
    """The socket closed (QEMU exited or the agent's port went away) with requests pending."""


class _Pending:
    __slots__ = ("event", "reply")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reply: dict | None = None


class ChannelStream:
    """The host end of one stream: the agent's messages for its id, in order.

    get() returns each message ({"out", "fd"}, then {"rc", "done"}; or {"error"} if the agent
    refused it or restarted) and raises ChannelClosed once the connection is gone.
    """

    def __init__(self, channel: Channel, rid: str):
        self.channel = channel
        self.id = rid
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._closed: str | None = None

    def _put(self, msg: dict) -> None:
        self._q.put(msg)

    def get(self, timeout: float | None = None) -> dict | None:
        """The next message, or None if none came within `timeout` s."""
        if self._closed:
            raise ChannelClosed(self._closed)
        try:
            msg = self._q.get(timeout=timeout)
        except queue.Empty:
            return None
        if "_closed" in msg:
            self._closed = msg["_closed"]
            raise ChannelClosed(self._closed)
        return msg

    def post(self, op: str, **fields) -> None:
        """Send control op `op` to this stream (input, signal, resize); no reply is awaited."""
        self.channel.post({"op": op, "target": self.id, **fields})

    def close(self) -> None:
        """Stop receiving: later messages for this stream are dropped."""
        self.channel._drop_stream(self.id)


class Channel:
    def __init__(
        self,
        path: Path | None,
        *,
        connect_timeout: float = 5.0,
        sock: socket.socket | None = None,
    ):
        """Connect to the agent socket at `path` (or use the connected `sock`, for tests)."""
        self.path = Path(path) if path is not None else None
        if sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(connect_timeout)
            try:
                sock.connect(str(self.path))
                sock.settimeout(None)
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        self._prefix = f"{os.getpid()}-{id(self):x}-"
        # Tells the agent a new client begins, so that the previous one's streams are hung up
        # even if the agent missed the port's EOF. Agents before streams answer an error with
        # no id (dropped below). An OSError here is a failed connection, as from connect().
        hello = {"op": "hello", "client": self._prefix.rstrip("-")}
        try:
            sock.sendall((json.dumps(hello, separators=(",", ":")) + "\n").encode())
        except BaseException:
            sock.close()
            raise
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._wlock = threading.Lock()
        self._pending: dict[str, _Pending] = {}
        self._streams: dict[str, ChannelStream] = {}
        self._events: list[dict] = []
        self._event_cv = threading.Condition(self._lock)
        self._closed: str | None = None
        self._closing = False  # close() was called: the end is ours, not the agent's
        self._reader = threading.Thread(target=self._read_loop, name="vm-channel", daemon=True)
        self._reader.start()

    # -- reading ---------------------------------------------------------------------------------
    def _read_loop(self) -> None:
        buf = b""
        why = "agent channel closed"
        try:
            while True:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    self._dispatch(line)
        except OSError as e:
            why = f"agent channel error: {e}"
        if self._closing:
            why = "agent channel closed by this client (disconnected)"
        with self._lock:
            self._closed = why
            for p in self._pending.values():
                p.event.set()
            for st in self._streams.values():
                st._put({"_closed": why})
            self._streams.clear()
            self._event_cv.notify_all()

    def _dispatch(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            return  # noise on the port (cannot happen with our agent); not a reply to anyone
        if not isinstance(msg, dict):
            return
        with self._lock:
            if "event" in msg:
                self._events.append(msg)
                self._event_cv.notify_all()
                if msg["event"] == "ready":
                    # The agent (re)started: requests sent before it will never be answered.
                    for p in self._pending.values():
                        p.reply = {"error": "the VM agent restarted; the request was lost"}
                        p.event.set()
                    for st in self._streams.values():
                        st._put({"error": "the VM agent restarted; the command was lost"})
                    self._streams.clear()
                return
            st = self._streams.get(msg.get("id"))
            if st is not None:
                st._put(msg)
                if msg.get("done") or "error" in msg:
                    del self._streams[st.id]
                return
            p = self._pending.get(msg.get("id"))
            if p is not None:
                p.reply = msg
                p.event.set()

    def wait_event(self, name: str, timeout: float) -> dict | None:
        """The first event `name` the agent sent, waiting up to `timeout`; None if none came."""
        with self._lock:
            ok = self._event_cv.wait_for(
                lambda: self._closed or any(e["event"] == name for e in self._events), timeout
            )
            if not ok:
                return None
            for e in self._events:
                if e["event"] == name:
                    return e
            return None

    # -- requests --------------------------------------------------------------------------------
    def request(self, msg: dict, timeout: float | None) -> dict | None:
        """Send `msg` with a fresh id; the reply, or None if none came within `timeout`.

        Raises ChannelClosed if the connection is (or becomes) closed.
        """
        rid = self._prefix + str(next(self._ids))
        p = _Pending()
        with self._lock:
            if self._closed:
                raise ChannelClosed(self._closed)
            self._pending[rid] = p
        data = (json.dumps({**msg, "id": rid}, separators=(",", ":")) + "\n").encode()
        try:
            with self._wlock:
                self.sock.sendall(data)
            p.event.wait(timeout)
        except OSError as e:
            raise ChannelClosed(f"agent channel error: {e}") from e
        finally:
            with self._lock:
                self._pending.pop(rid, None)
        if p.reply is None and self._closed:
            raise ChannelClosed(self._closed)
        return p.reply

    def open_stream(self, msg: dict) -> ChannelStream:
        """Send `msg` (an op "stream") with a fresh id; its messages go to the returned queue.

        Raises ChannelClosed if the connection is closed.
        """
        st = ChannelStream(self, self._prefix + str(next(self._ids)))
        with self._lock:
            if self._closed:
                raise ChannelClosed(self._closed)
            self._streams[st.id] = st
        try:
            self._send({**msg, "id": st.id})
        except ChannelClosed:
            self._drop_stream(st.id)
            raise
        return st

    def post(self, msg: dict) -> None:
        """Send `msg` as is, waiting for no reply. Raises ChannelClosed if closed."""
        if self._closed:
            raise ChannelClosed(self._closed)
        self._send(msg)

    def _send(self, msg: dict) -> None:
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        try:
            with self._wlock:
                self.sock.sendall(data)
        except OSError as e:
            raise ChannelClosed(f"agent channel error: {e}") from e

    def _drop_stream(self, rid: str) -> None:
        with self._lock:
            self._streams.pop(rid, None)

    def close(self) -> None:
        self._closing = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader with EOF
        except OSError:
            pass
        if self._reader is not threading.current_thread():
            self._reader.join(timeout=2)
        self.sock.close()

    @property
    def closed(self) -> bool:
        return self._closed is not None
