"""The command agent inside the lab VM: runs argv lists for the host over a virtio-serial port.

This module is the agent's transport and dispatch: the port (or a socket, or --stdio), the reader
loop, which op goes where, ping and poweroff; running the commands is lab.substrate.vm.agentcommands.

Runs under the host root's /usr/bin/python3 (standard library only: it must not depend on the
project's venv, which may not exist yet). It ships as ONE script, assembled on the host by
lab.substrate.vm.agentscript.agent_source(): this file with agentcommands.py's text in place of
its import of it (the one line that names lab). The initramfs carries that script and the init
copies it to /run/lab/agent.py; on a real board (lab.substrate.boards.connection) ssh starts it with
--stdio: requests on stdin, replies on stdout.

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

import json
import os
import signal
import sys
import threading
import time

# lab.substrate.vm.agentscript ships agentcommands.py's text in place of this import
from lab.substrate.vm.agentcommands import BASE_ENV, Stream, log, run_request

PORT_NAME = "lab.agent"
INIT_DONE = "/run/lab/init-done"
OPS = ("run", "ping", "poweroff", "stream", "input", "signal", "resize", "hello")


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
        # A board over SSH (lab.substrate.boards.connection): one ssh session's stdin and stdout; EOF on
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
