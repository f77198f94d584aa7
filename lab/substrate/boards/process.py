"""BoardProcess: a command started on a board by BoardNode.popen, seen as a subprocess.Popen
(pid, returncode, poll, wait, signals) over one agent stream, its output copied where the
caller said.
"""

from __future__ import annotations

import base64
import codecs
import io
import os
import subprocess
import threading
from collections.abc import Callable

from lab.substrate.vm.channel import ChannelClosed


class BoardProcess:
    """What BoardNode.popen returns: the part of subprocess.Popen the lab's callers use (pid,
    returncode, poll, wait, send_signal, terminate, kill), over one agent stream.

    A thread copies the command's output into `stdout` / `stderr` (file objects, raw fds, or
    None / DEVNULL to discard). Signals go to the command's process group on the board. Its
    exit status is the shell's (128 + n when killed by signal n); 255 when the session died.
    """

    def __init__(self, argv: list[str], stream, stdout, stderr):
        self.args = argv
        self.stream = stream
        self.stdout = self.stderr = None  # no PIPE: output goes where the caller said
        self.pid: int | None = None
        self.returncode: int | None = None
        out = _sink(stdout)
        self._sinks = {1: out, 2: out if stderr == subprocess.STDOUT else _sink(stderr)}
        self._pid_buf = b""
        self._pid_known = threading.Event()
        self._done = threading.Event()
        threading.Thread(target=self._pump, name=f"board-popen-{stream.id}", daemon=True).start()
        self._pid_known.wait()  # ~1 ms: the shell prints it before exec

    def _pump(self) -> None:
        rc = 255
        try:
            while True:
                msg = self.stream.get()
                if "out" in msg:
                    self._output(msg.get("fd", 1), base64.b64decode(msg["out"]))
                elif msg.get("done"):
                    rc = msg.get("rc", 255)
                    break
                elif "error" in msg:
                    self._sinks[2](f"lab-agent: {msg['error']}\n".encode())
                    break
        except ChannelClosed as e:
            self._sinks[2](f"board session lost: {e}\n".encode())
        finally:
            for write in self._sinks.values():
                write(None)
            self.returncode = rc
            self._pid_known.set()
            self._done.set()

    def _output(self, fd: int, data: bytes) -> None:
        if fd == 2 and not self._pid_known.is_set():
            self._pid_buf += data
            if b"\n" not in self._pid_buf:
                return
            line, _, data = self._pid_buf.partition(b"\n")
            self.pid = int(line)
            self._pid_known.set()
        if data:
            self._sinks[fd](data)

    def poll(self) -> int | None:
        return self.returncode if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self._done.is_set():
            return
        try:
            self.stream.post("signal", sig=int(sig))
        except ChannelClosed:
            pass  # the agent hangs the command up itself when the session goes

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)


def _sink(target) -> Callable[[bytes | None], None]:
    """A writer of output chunks into `target` (None flushes it at the end)."""
    if target is None or target == subprocess.DEVNULL:
        return lambda data: None
    if isinstance(target, int):

        def write_fd(data: bytes | None) -> None:
            view = memoryview(data or b"")
            while view:
                view = view[os.write(target, view) :]

        return write_fd
    text = isinstance(target, io.TextIOBase)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write(data: bytes | None) -> None:
        if data is None:
            if text:
                target.write(decoder.decode(b"", final=True))
            target.flush()
            return
        target.write(decoder.decode(data) if text else data)
        target.flush()

    return write
