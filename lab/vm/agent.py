"""The command agent inside the lab VM: runs argv lists for the host over a virtio-serial port.

Runs under the host root's /usr/bin/python3 (standard library only: it must not depend on the
project's venv, which may not exist yet). The init copies it to /run/lab/agent.py.

Protocol, one JSON object per line in each direction (see docs/vm.md):
  host -> agent  {"id": "...", "op": "run", "argv": [...], "env": {...}, "timeout": s,
                  "input": "...", "cwd": "..."}
                 {"id": "...", "op": "ping"}      {"id": "...", "op": "poweroff"}
  agent -> host  {"id": "...", "rc": n, "stdout": "...", "stderr": "...", "timed_out": false}
                 {"id": "...", "pong": true, "kernel": "...", "uptime": s}
                 {"event": "ready", "kernel": "...", "uptime": s}  (once, when the agent starts)
Each request runs in its own thread, so requests may overlap; replies carry the request's id and
come back in completion order.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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


def log(msg: str) -> None:
    print(f"lab-agent: {msg}", file=sys.stderr, flush=True)


def find_port(name: str) -> str:
    """/dev/vportNpM of the virtio-serial port called `name` (there is no udev for the symlink)."""
    base = "/sys/class/virtio-ports"
    for _ in range(100):
        for entry in sorted(os.listdir(base)) if os.path.isdir(base) else []:
            try:
                with open(f"{base}/{entry}/name") as f:
                    if f.read().strip() == name:
                        return f"/dev/{entry}"
            except OSError:
                continue
        time.sleep(0.05)
    raise SystemExit(f"lab-agent: no virtio-serial port named {name!r}")


def uptime() -> float:
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


class Port:
    """Line-framed access to the port. virtio_console returns EOF while no host is connected
    and writes at most 32 KiB per call, so both directions loop."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        self.wlock = threading.Lock()

    def lines(self):
        buf = b""
        while True:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                # Host side not connected (yet, or any more): a reconnecting host starts afresh.
                buf = b""
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
                n = os.write(self.fd, view)
                view = view[n:]


def run_request(req: dict) -> dict:
    argv = req.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
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
            reply = {"error": f"unknown op {op!r}; valid: run, ping, poweroff"}
    except Exception as e:  # noqa: BLE001 - any failure must reach the host, not kill the agent
        reply = {"rc": 127, "stdout": "", "stderr": f"lab-agent: {type(e).__name__}: {e}"}
    reply["id"] = rid
    port.send(reply)


def main() -> None:
    # The init starts us early, to overlap our start-up with its mounts; wait until it is done.
    while not os.path.exists(INIT_DONE):
        time.sleep(0.01)
    port = Port(find_port(PORT_NAME))
    port.send({"event": "ready", "kernel": os.uname().release, "uptime": uptime()})
    log(f"ready after {uptime():.2f} s of uptime")
    for line in port.lines():
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise TypeError("request is not an object")
        except (ValueError, TypeError) as e:
            port.send({"id": None, "error": f"bad request: {e}"})
            continue
        threading.Thread(target=handle, args=(port, req), daemon=True).start()


if __name__ == "__main__":
    main()
