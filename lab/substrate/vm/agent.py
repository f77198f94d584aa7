"""The command agent inside the lab VM: runs argv lists for the host over a virtio-serial port.

Runs under the host root's /usr/bin/python3 (standard library only: it must not depend on the
project's venv, which may not exist yet). The init copies it to /run/lab/agent.py. On a real
board (lab.substrate.boards.node) ssh starts it with --stdio: requests on stdin, replies on stdout.

Protocol, one JSON object per line in each direction (see docs/vm.md):
  host -> agent  {"id": "...", "op": "run", "argv": [...], "env": {...}, "timeout": s,
                  "input": "...", "cwd": "..."}
                 {"id": "...", "op": "ping"}      {"id": "...", "op": "poweroff"}
                 {"id": "...", "op": "stream", "argv": [...], "env": {...}, "cwd": "...",
                  "tty": bool, "rows": n, "cols": n}
                 {"op": "input", "target": "<stream id>", "data": "<base64>"}
                 {"op": "input", "target": "...", "eof": true}
                 {"op": "signal", "target": "...", "sig": n}
                 {"op": "resize", "target": "...", "rows": n, "cols": n}
                 {"op": "hello", "client": "..."}  (first line of each host connection)
  agent -> host  {"id": "...", "rc": n, "stdout": "...", "stderr": "...", "timed_out": false}
                 {"id": "...", "pong": true, "kernel": "...", "uptime": s}
                 {"id": "<stream id>", "out": "<base64>", "fd": 1|2}   (any number, in order)
                 {"id": "<stream id>", "rc": n, "done": true}          (last of a stream)
                 {"event": "ready", "kernel": "...", "uptime": s}  (once, when the agent starts)
Each run/ping/poweroff request runs in its own thread, so requests may overlap; replies carry the
request's id and come back in completion order. Stream and control ops are handled in the reader
loop, in arrival order, and never wait on the port: control ops get no reply (one with an "id"
gets {"id", "ok": true} or {"id", "error"}). When the host disconnects (EOF on the port, or a
"hello" from the next host: under TCG a quick reconnect can hide the EOF), every running
stream's process group gets SIGHUP (then SIGCONT) and the stream sends nothing more.
QEMU gives the VM several such ports (lab.agent, lab.agent.1, ...), one host client each; every
port has its own reader loop and streams, so one client's disconnect hangs up only its own.
"""

from __future__ import annotations

import base64
import fcntl
import json
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

PORT_NAME = "lab.agent"
INIT_DONE = "/run/lab/init-done"
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
OPS = ("run", "ping", "poweroff", "stream", "input", "signal", "resize", "hello")


def log(msg: str) -> None:
    print(f"lab-agent: {msg}", file=sys.stderr, flush=True)


def find_port(name: str, *, tries: int = 100) -> str | None:
    """/dev/vportNpM of the virtio-serial port called `name` (there is no udev for the symlink)."""
    base = "/sys/class/virtio-ports"
    for _ in range(tries):
        for entry in sorted(os.listdir(base)) if os.path.isdir(base) else []:
            try:
                with open(f"{base}/{entry}/name") as f:
                    if f.read().strip() == name:
                        return f"/dev/{entry}"
            except OSError:
                continue
        time.sleep(0.05)
    return None


def extra_ports() -> list[str]:
    """The ports after the first (PORT_NAME.1, .2, ...) that QEMU gave this VM."""
    found = []
    while (path := find_port(f"{PORT_NAME}.{len(found) + 1}", tries=1)) is not None:
        found.append(path)
    return found


def uptime() -> float:
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


class Port:
    """Line-framed access to the port (or, for tests, any connected stream socket's fd).

    virtio_console returns EOF while no host is connected and writes at most 32 KiB per call, so
    both directions loop. With `reconnects` (the virtio port) an EOF means "the host went away,
    a later one may connect": reading goes on. Without it (a socket) the first EOF ends lines().
    Replies go to `wfd` when given (--stdio: requests on fd 0, replies on fd 1).
    """

    def __init__(self, fd: int, *, reconnects: bool = True, wfd: int | None = None):
        self.fd = fd
        self.wfd = fd if wfd is None else wfd
        self.reconnects = reconnects
        self.wlock = threading.Lock()

    @classmethod
    def open(cls, path: str) -> Port:
        return cls(os.open(path, os.O_RDWR | os.O_CLOEXEC))

    def lines(self, on_disconnect=None):
        """Yield the request lines; call `on_disconnect()` at each EOF (host not connected)."""
        buf = b""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except ConnectionError:
                chunk = b""
            if not chunk:
                # Host side not connected (yet, or any more): a reconnecting host starts afresh.
                buf = b""
                if on_disconnect is not None:
                    on_disconnect()
                if not self.reconnects:
                    return
                time.sleep(0.1)
                continue
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.strip():
                    yield line

    def send(self, obj: dict) -> None:
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        with self.wlock:
            view = memoryview(data)
            while view:
                n = os.write(self.wfd, view)
                view = view[n:]


def run_request(req: dict) -> dict:
    argv = req.get("argv")
    if not _valid_argv(argv):
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


def _valid_argv(argv) -> bool:
    return isinstance(argv, list) and bool(argv) and all(isinstance(a, str) for a in argv)


def _exit_status(rc: int) -> int:
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
    which owns and closes the stdin side).
    """

    def __init__(self, agent: Agent, rid, req: dict):
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
        if not _valid_argv(argv):
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
        rc = _exit_status(self.proc.wait())
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


class Agent:
    """Reads requests from the port and answers them; tracks the running streams."""

    def __init__(self, port: Port):
        self.port = port
        self.lock = threading.Lock()
        self.streams: dict[object, Stream] = {}

    def serve(self) -> None:
        for line in self.port.lines(self.host_disconnected):
            try:
                req = json.loads(line)
                if not isinstance(req, dict):
                    raise TypeError("request is not an object")
            except (ValueError, TypeError) as e:
                self.send_later({"id": None, "error": f"bad request: {e}"})
                continue
            try:
                self.dispatch(req)
            except Exception as e:  # noqa: BLE001 - the reader loop must survive any request
                self.send_later({"id": req.get("id"), "error": f"{type(e).__name__}: {e}"})

    def send_later(self, msg: dict) -> None:
        # The reader loop never writes to the port itself: writes block while no host is
        # connected, and the loop must see the EOF that says so.
        threading.Thread(target=self.port.send, args=(msg,), daemon=True).start()

    def dispatch(self, req: dict) -> None:
        op = req.get("op", "run")
        if op == "stream":
            s = Stream(self, req.get("id"), req)
            if s.proc is not None:
                with self.lock:
                    self.streams[s.rid] = s
            s.start_threads()
        elif op == "hello":
            # A new host connection (QEMU serves one at a time): the previous host is gone, even
            # if we never saw the port's EOF (it reconnected before this thread ran).
            self.host_disconnected()
        elif op in ("input", "signal", "resize"):
            with self.lock:
                s = self.streams.get(req.get("target"))
            try:
                if s is None:
                    raise LookupError(f"no running stream {req.get('target')!r}")
                s.control(req)
                reply = {"ok": True}
            except Exception as e:  # noqa: BLE001 - a bad control op must not kill the agent
                reply = {"error": f"{op}: {type(e).__name__}: {e}"}
            if req.get("id") is not None:
                self.send_later({**reply, "id": req["id"]})
        else:
            threading.Thread(target=handle, args=(self.port, req), daemon=True).start()

    def forget(self, stream: Stream) -> None:
        with self.lock:
            if self.streams.get(stream.rid) is stream:
                del self.streams[stream.rid]

    def host_disconnected(self) -> None:
        with self.lock:
            attached = [s for s in self.streams.values() if not s.detached]
        for s in attached:
            s.hangup()


def handle(port: Port, req: dict) -> None:
    rid = req.get("id")
    op = req.get("op", "run")
    try:
        if op == "ping":
            reply = {"pong": True, "kernel": os.uname().release, "uptime": uptime()}
        elif op == "run":
            reply = run_request(req)
        elif op == "poweroff":
            port.send({"id": rid, "poweroff": True})
            os.sync()
            # busybox poweroff -f: reboot(2) straight away; 9p writes are already synchronous.
            os.execv("/run/lab/busybox", ["poweroff", "-f"])
        else:
            reply = {"error": f"unknown op {op!r}; valid: {', '.join(OPS)}"}
    except Exception as e:  # noqa: BLE001 - any failure must reach the host, not kill the agent
        reply = {"rc": 127, "stdout": "", "stderr": f"lab-agent: {type(e).__name__}: {e}"}
    reply["id"] = rid
    port.send(reply)


def main(args: list[str] | None = None) -> None:
    args = sys.argv[1:] if args is None else args
    # The init starts us in the background of a non-interactive shell, which ignores SIGINT and
    # SIGQUIT; commands would inherit that (Ctrl-C on a tty stream would do nothing).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    if args[:1] == ["--fd"]:
        # Tests: serve one connected socket (inherited as this fd) until it closes.
        port = Port(int(args[1]), reconnects=False)
    elif args[:1] == ["--stdio"]:
        # A board over SSH (lab.substrate.boards.node): one ssh session's stdin and stdout; EOF on
        # stdin (the controller closed it, or the connection dropped) ends serve() and us.
        port = Port(0, reconnects=False, wfd=1)
        # Commands start from BASE_ENV, not from ours; a board whose sshd sets
        # LAB_AGENT_KEEP_ENV=NAME,... (SetEnv) passes those variables on to every command (an
        # emulated board's CPU masks: OPENSSL_ia32cap, GODEBUG).
        keep = [k for k in os.environ.get("LAB_AGENT_KEEP_ENV", "").split(",") if k]
        BASE_ENV.update({k: os.environ[k] for k in keep if k in os.environ})
    else:
        # The init starts us early, to overlap our start-up with its mounts; wait until done.
        while not os.path.exists(INIT_DONE):
            time.sleep(0.01)
        path = find_port(PORT_NAME)
        if path is None:
            raise SystemExit(f"lab-agent: no virtio-serial port named {PORT_NAME!r}")
        port = Port.open(path)
        # every further port serves one more host client, each with its own streams
        for extra in extra_ports():
            threading.Thread(target=Agent(Port.open(extra)).serve, daemon=True).start()
    port.send({"event": "ready", "kernel": os.uname().release, "uptime": uptime()})
    log(f"ready after {uptime():.2f} s of uptime")
    agent = Agent(port)
    agent.serve()
    # Only a test's socket or --stdio ends serve(): give the hung-up streams a moment to be
    # reaped.
    deadline = time.monotonic() + 5
    while agent.streams and time.monotonic() < deadline:
        time.sleep(0.05)


if __name__ == "__main__":
    main()
