"""Host side of the agent protocol: JSON lines over QEMU's virtio-serial unix socket.

One connection carries many requests at once: each gets a unique id, a reader thread hands every
reply to the request waiting for that id, and replies for ids this client never sent (left over
from a previous client of the same VM) are dropped. QEMU's socket chardev takes one client at a
time; a new one may connect after the previous has closed.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import threading
from pathlib import Path

from ..errors import StartupError


class ChannelClosed(StartupError):
    """The socket closed (QEMU exited or the agent's port went away) with requests pending."""


class _Pending:
    __slots__ = ("event", "reply")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reply: dict | None = None


class Channel:
    def __init__(self, path: Path, *, connect_timeout: float = 5.0):
        self.path = Path(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(connect_timeout)
        self.sock.connect(str(self.path))
        self.sock.settimeout(None)
        self._prefix = f"{os.getpid()}-{id(self):x}-"
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._wlock = threading.Lock()
        self._pending: dict[str, _Pending] = {}
        self._events: list[dict] = []
        self._event_cv = threading.Condition(self._lock)
        self._closed: str | None = None
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
        with self._lock:
            self._closed = why
            for p in self._pending.values():
                p.event.set()
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

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._reader.join(timeout=2)

    @property
    def closed(self) -> bool:
        return self._closed is not None
