"""How the lab agent runs commands: "run" (one command, its output returned when it ends:
run_request) and "stream" (a command on pipes or a pty whose output is relayed as it arrives,
its stdin fed, signalled, resized, hung up: Stream), both from BASE_ENV.

Standard library only, like lab.substrate.vm.agent, which it is part of: the agent ships as ONE
script (lab.substrate.vm.agentscript puts this file's text in place of agent.py's import of it),
copied into the VM's initramfs and sent down a board's ssh session. It must therefore import
nothing of lab and name nothing of agent.py; a Stream reaches its agent only through the object
it is given (its `port.send` and `forget`).
"""

from __future__ import annotations

import base64
import fcntl
import os
import queue
import selectors
import signal
import struct
import subprocess
import sys
import termios
import threading
import time

BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    # The project dir is a 9p share with write-back caching (cache=loose): a .pyc written here
    # could reach the host after its rename, half-written. The host writes the .pyc files.
    "PYTHONDONTWRITEBYTECODE": "1",
}
#: TERM of a tty stream whose request names none
TTY_TERM = "xterm"
#: bytes read from a stream's output per message
CHUNK = 65536
#: after a tty stream's process exited, output still arriving (from a background process that
#: holds the terminal) is relayed until it pauses this long, for at most DRAIN_MAX s
DRAIN_QUIET, DRAIN_MAX = 0.2, 2.0


def log(msg: str) -> None:
    print(f"lab-agent: {msg}", file=sys.stderr, flush=True)


def run_request(req: dict) -> dict:
    argv = req.get("argv")
    if not valid_argv(argv):
        return {
            "rc": 127,
            "stdout": "",
            "stderr": "lab-agent: argv must be a non-empty list of str",
        }
    env = dict(BASE_ENV)
    env.update(req.get("env") or {})
    timeout = req.get("timeout")
    data = req.get("input")
    try:
        p = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=req.get("cwd") or "/",
            start_new_session=True,  # so a timeout can kill the whole process group
        )
    except OSError as e:
        return {"rc": 127, "stdout": "", "stderr": f"lab-agent: {argv[0]}: {e.strerror}"}
    timed_out = False
    try:
        out, err = p.communicate(data.encode() if data is not None else None, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
    return {
        "rc": p.returncode,
        "stdout": out.decode(errors="replace"),
        "stderr": err.decode(errors="replace"),
        "timed_out": timed_out,
    }


def valid_argv(argv) -> bool:
    return isinstance(argv, list) and bool(argv) and all(isinstance(a, str) for a in argv)


def exit_status(rc: int) -> int:
    """Popen's returncode as a shell reports it: 128 + n when killed by signal n."""
    return 128 - rc if rc < 0 else rc


def _take_controlling_tty() -> None:
    # Runs in the child between fork and exec, after setsid(): stdin is the pty's slave.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _set_winsize(fd: int, rows, cols) -> None:
    rows, cols = max(0, min(int(rows), 0xFFFF)), max(0, min(int(cols), 0xFFFF))
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


_EOF, _STOP = object(), object()


class Stream:
    """One "stream" request: a command whose output is relayed as it arrives.

    Started in the reader loop (so that control ops that follow find it); its own threads then
    relay output (`_pump`, which also sends the final message) and feed its stdin (`_feed`,
    which owns and closes the stdin side). `agent` is the lab.substrate.vm.agent.Agent that
    started it: output goes to `agent.port.send`, and `agent.forget(self)` when it ends.
    """

    def __init__(self, agent, rid, req: dict):
        self.agent = agent
        self.rid = rid
        self.tty = bool(req.get("tty"))
        self.detached = False  # the host that asked went away: relay nothing more
        self.proc: subprocess.Popen | None = None
        self.error: str | None = None
        self.inq: queue.SimpleQueue = queue.SimpleQueue()
        self.outputs: dict[int, int] = {}  # our fd -> the fd number reported to the host
        self.stdin_fd: int | None = None
        self._files: list = []  # pipe file objects to close when done
        argv = req.get("argv")
        if not valid_argv(argv):
            self.error = "lab-agent: argv must be a non-empty list of str\n"
            return
        env = dict(BASE_ENV)
        if self.tty:
            env["TERM"] = TTY_TERM
        env.update(req.get("env") or {})
        cwd = req.get("cwd") or "/"
        try:
            if self.tty:
                self._start_tty(argv, env, cwd, req.get("rows") or 24, req.get("cols") or 80)
            else:
                self._start_pipes(argv, env, cwd)
        except Exception as e:  # noqa: BLE001 - reported as the command's stderr, rc 127
            self.error = f"lab-agent: {argv[0]}: {getattr(e, 'strerror', None) or e}\n"

    def _start_tty(self, argv, env, cwd, rows, cols) -> None:
        master, slave = os.openpty()
        try:
            _set_winsize(master, rows, cols)
            self.proc = subprocess.Popen(
                argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
                start_new_session=True, preexec_fn=_take_controlling_tty,
            )  # fmt: skip
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)  # the child has it; ours would keep the master from seeing EIO
        self.outputs = {master: 1}
        self.stdin_fd = master

    def _start_pipes(self, argv, env, cwd) -> None:
        p = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, cwd=cwd, start_new_session=True, bufsize=0,
        )  # fmt: skip
        self.proc = p
        self._files = [p.stdout, p.stderr]
        self.outputs = {p.stdout.fileno(): 1, p.stderr.fileno(): 2}
        self.stdin_fd = p.stdin.fileno()

    def start_threads(self) -> None:
        threading.Thread(target=self._pump, name=f"stream-{self.rid}", daemon=True).start()
        if self.proc is not None:
            threading.Thread(target=self._feed, name=f"stdin-{self.rid}", daemon=True).start()

    # -- output ----------------------------------------------------------------------------------
    def _send(self, msg: dict) -> None:
        if self.detached:
            return
        try:
            self.agent.port.send(msg)
        except OSError:
            self.detached = True  # the host is gone (a test's socket); keep draining

    def _pump(self) -> None:
        if self.proc is None:
            self._send({"id": self.rid, "out": _b64(self.error.encode()), "fd": 2})
            self._send({"id": self.rid, "rc": 127, "done": True})
            return
        try:
            self._relay_output()
        except Exception as e:  # noqa: BLE001 - the stream must still end with its exit status
            log(f"stream {self.rid}: {type(e).__name__}: {e}")
        rc = exit_status(self.proc.wait())
        for f in self._files:
            f.close()
        self.inq.put(_STOP)  # the feeder closes the stdin side (the pty master in tty mode)
        self.agent.forget(self)
        self._send({"id": self.rid, "rc": rc, "done": True})

    def _relay_output(self) -> None:
        """Send output as it comes until every output fd is at EOF; in tty mode also stop once
        the command has exited and the terminal's output pauses (a background process that
        keeps the terminal open must not hold the stream open)."""
        sel = selectors.DefaultSelector()
        for fd in self.outputs:
            sel.register(fd, selectors.EVENT_READ)
        pidfd = None
        if self.tty:
            pidfd = os.pidfd_open(self.proc.pid)  # readable once the process has exited
            sel.register(pidfd, selectors.EVENT_READ)
        open_fds = set(self.outputs)
        drain_until = None
        try:
            while open_fds:
                timeout = None
                if drain_until is not None:
                    timeout = min(DRAIN_QUIET, drain_until - time.monotonic())
                    if timeout <= 0:
                        break
                ready = sel.select(timeout)
                if not ready and drain_until is not None:
                    break
                for key, _ in ready:
                    if key.fd == pidfd:
                        sel.unregister(pidfd)
                        drain_until = time.monotonic() + DRAIN_MAX
                        continue
                    try:
                        data = os.read(key.fd, CHUNK)
                    except OSError:  # EIO: the pty's last slave fd closed
                        data = b""
                    if not data:
                        sel.unregister(key.fd)
                        open_fds.discard(key.fd)
                        continue
                    self._send({"id": self.rid, "out": _b64(data), "fd": self.outputs[key.fd]})
        finally:
            sel.close()
            if pidfd is not None:
                os.close(pidfd)

    # -- input -----------------------------------------------------------------------------------
    def _feed(self) -> None:
        fd, broken = self.stdin_fd, False
        while True:
            item = self.inq.get()
            if item is _STOP:
                break
            if broken or fd is None:
                continue
            try:
                if item is _EOF:
                    if self.tty:  # a terminal has no EOF of its own: type the EOF character
                        item = termios.tcgetattr(fd)[6][termios.VEOF]
                    else:
                        self.proc.stdin.close()
                        fd = None
                        continue
                view = memoryview(item)
                while view:
                    view = view[os.write(fd, view) :]
            except OSError:
                broken = True  # the command closed its stdin (or exited): drop the rest
        if fd is not None:
            if self.tty:
                os.close(fd)
            else:
                try:
                    self.proc.stdin.close()
                except OSError:
                    pass

    # -- control ---------------------------------------------------------------------------------
    def control(self, req: dict) -> None:
        op = req["op"]
        if op == "input":
            if req.get("data"):
                self.inq.put(base64.b64decode(req["data"]))
            if req.get("eof"):
                self.inq.put(_EOF)
        elif op == "signal":
            self.signal(int(req["sig"]))
        elif op == "resize":
            if self.tty:
                # The kernel sends SIGWINCH to the terminal's foreground process group.
                _set_winsize(self.stdin_fd, req["rows"], req["cols"])

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)  # its own session: process group id == its pid
        except ProcessLookupError:
            pass

    def hangup(self) -> None:
        """The host went away: like a terminal hangup, SIGHUP (and SIGCONT) to the group."""
        self.detached = True
        self.signal(signal.SIGHUP)
        self.signal(signal.SIGCONT)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
