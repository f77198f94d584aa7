"""Attach the host's terminal (or any files) to a command in the lab VM: `lab exec`, `lab shell`.

attach() starts the command with VM.start_stream and relays both ways until it ends:

* tty mode (a pseudo-terminal in the guest; the default when the host's stdin and stdout are
  both terminals): the host terminal is put in raw mode (restored on every way out) and every
  byte typed goes to the guest verbatim, so Ctrl-C, Ctrl-Z and Ctrl-D act through the guest's
  line discipline, as under ssh -t. The window size is passed at start and on each SIGWINCH.
* pipe mode: stdin is forwarded (EOF closes the command's stdin), its stdout and stderr are
  written to ours as each chunk arrives, and SIGINT/SIGTERM/SIGHUP/SIGQUIT sent to this process
  (Ctrl-C on the host terminal, a kill) are forwarded to the command's process group instead of
  stopping this process.

In both modes the forwarded signals' previous handlers are restored afterwards. Handlers are
only installed when attach runs in the main thread (Python allows no other).
"""

from __future__ import annotations

import os
import queue
import select
import signal
import sys
import termios
import threading
import tty as _tty
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from lab.core.errors import CommandError
from lab.substrate.vm.machine import VM, Stream

#: signals forwarded to the guest command while attached (SIGWINCH is a resize, tty mode)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)

Stdio = IO[Any] | int | None


def _fileno(obj: Stdio) -> int | None:
    if obj is None:
        return None
    if isinstance(obj, int):
        return obj
    try:
        return obj.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return None


def _isatty(fd: int | None) -> bool:
    return fd is not None and os.isatty(fd)


def _window_size(*fds: int | None) -> tuple[int, int]:
    for fd in fds:
        if _isatty(fd):
            try:
                size = os.get_terminal_size(fd)
            except OSError:
                continue
            if size.lines and size.columns:
                return size.lines, size.columns
    return 24, 80


def _writer(obj: Stdio) -> Callable[[bytes], None]:
    """A function writing bytes to `obj` (fd, binary file, or text file with .buffer) and
    flushing at once, so that progress shows while the command runs."""
    if isinstance(obj, int):
        fd = obj

        def write_fd(data: bytes) -> None:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]

        return write_fd
    buffer = getattr(obj, "buffer", None)
    if buffer is not None:  # a text stream: flush what it holds, then write under it
        obj.flush()
        obj = buffer

    def write_file(data: bytes) -> None:
        obj.write(data)
        obj.flush()

    return write_file


def attach(
    vm: VM,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    tty: bool | None = None,
    stdin: Stdio = None,
    stdout: Stdio = None,
    stderr: Stdio = None,
) -> int:
    """Run argv in `vm` attached to stdin/stdout/stderr (default: this process's) and return
    its exit status (128 + n if a signal n killed it).

    `tty=None`: a pseudo-terminal when stdin and stdout are both terminals. `tty=True` without a
    host terminal still gives the command a terminal (24x80 unless stdout has a size); the host
    side is then not switched to raw mode. stdin/stdout/stderr may be fds, binary files or text
    files with a .buffer; a stdin without a fd (BytesIO) is read to its end and forwarded.
    CommandError(where="vm") if the channel to the VM fails.
    """
    if stdin is None:
        stdin = sys.stdin  # None when this process has no stdin at all
    if stdout is None:
        stdout = sys.stdout
    if stderr is None:
        stderr = sys.stderr
    in_fd, out_fd = _fileno(stdin), _fileno(stdout)
    if tty is None:
        tty = _isatty(in_fd) and _isatty(out_fd)
    if tty:
        env = dict(env or {})
        env.setdefault("TERM", os.environ.get("TERM") or "xterm")
    rows, cols = _window_size(out_fd, in_fd)
    write_out, write_err = _writer(stdout), _writer(stderr)

    saved_tty = None
    stop_r, stop_w = os.pipe()
    controls: queue.SimpleQueue = queue.SimpleQueue()  # put() is safe in a signal handler
    saved_handlers: dict[int, Any] = {}
    threads: list[threading.Thread] = []
    stream: Stream | None = None
    try:
        stream = vm.start_stream(argv, env=env, cwd=cwd, tty=bool(tty), rows=rows, cols=cols)
        if tty and _isatty(in_fd):
            saved_tty = termios.tcgetattr(in_fd)
            _tty.setraw(in_fd, termios.TCSADRAIN)

        def on_signal(signum, frame):
            controls.put(("signal", signum))

        def on_winch(signum, frame):
            controls.put(("winch",))

        if threading.current_thread() is threading.main_thread():
            handlers = dict.fromkeys(FORWARDED, on_signal)
            if tty:
                handlers[signal.SIGWINCH] = on_winch
            for sig, handler in handlers.items():
                saved_handlers[sig] = signal.signal(sig, handler)

        threads.append(_start(_send_controls, stream, controls, out_fd, in_fd))
        threads.append(_start(_forward_stdin, stream, stdin, in_fd, stop_r))

        out_ok = True
        for fd, data in stream.events():
            if fd == 2:
                write_err(data)
            elif out_ok:
                try:
                    write_out(data)
                except BrokenPipeError:
                    # Our reader went away: the command gets SIGPIPE, as in a local pipeline.
                    out_ok = False
                    controls.put(("signal", signal.SIGPIPE))
        return stream.returncode
    finally:
        for sig, old in saved_handlers.items():
            signal.signal(sig, signal.SIG_DFL if old is None else old)  # None: set outside Python
        if saved_tty is not None:
            termios.tcsetattr(in_fd, termios.TCSADRAIN, saved_tty)
        os.write(stop_w, b"x")
        controls.put(None)
        for t in threads:
            t.join(timeout=2)
        os.close(stop_r)
        os.close(stop_w)
        if stream is not None:
            stream.close()  # hangs the command up if we leave early (an exception)


def _start(target, *args) -> threading.Thread:
    t = threading.Thread(target=target, args=args, name=f"vm-attach-{target.__name__}", daemon=True)
    t.start()
    return t


def _send_controls(stream: Stream, controls: queue.SimpleQueue, *size_fds: int | None) -> None:
    """Send what the signal handlers queued (they must not write to the channel themselves: the
    main thread may hold its lock when a handler runs)."""
    while True:
        item = controls.get()
        if item is None:
            return
        try:
            if item[0] == "signal":
                stream.signal(item[1])
            elif item[0] == "winch":
                stream.resize(*_window_size(*size_fds))
        except CommandError:
            return  # the channel failed; the main thread reports it


def _forward_stdin(stream: Stream, stdin: Stdio, fd: int | None, stop_fd: int) -> None:
    """Copy stdin to the command until EOF (then close its stdin) or until told to stop."""
    try:
        if stdin is None:
            pass
        elif fd is None:  # a file object without a fd (tests: BytesIO)
            read = getattr(stdin, "read1", stdin.read)
            while data := read(65536):
                stream.write(data)
        else:
            poll = select.poll()
            poll.register(fd, select.POLLIN)
            poll.register(stop_fd, select.POLLIN)
            while True:
                ready = {f for f, _ in poll.poll()}
                if stop_fd in ready:
                    return  # the command is done: leave the rest of stdin unread
                try:
                    data = os.read(fd, 65536)
                except OSError:  # EIO (terminal gone), EBADF (no stdin): as EOF
                    data = b""
                if not data:
                    break
                stream.write(data)
        stream.close_stdin()
    except CommandError:
        pass  # the channel failed; the main thread reports it
    except (OSError, ValueError):
        try:
            stream.close_stdin()
        except CommandError:
            pass
