"""Client of the userspace impairment engine `lab-impaird` (engine/, a Rust program).

The engine forwards frames between two interfaces of a hidden "bump" namespace and applies the
JSON impairment spec of docs/impairment-spec.md per direction (a2b, b2a). This module finds the
binary, builds its argument list, and talks to its control socket (Unix stream, one JSON object
per line each way). Starting it in the namespace is the caller's job (through lab.core.proc).
"""

from __future__ import annotations

from lab import REPO
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from lab.core.errors import CommandError, ConfigError, PreconditionError, StartupError
from lab.core.proc import which

ENGINE_DIR = REPO / "engine"
BUILD_COMMAND = "cargo build --release --manifest-path engine/Cargo.toml"
DIRECTIONS = ("a2b", "b2a", "both")


def _find(name: str) -> str:
    # LAB_ENGINE_DIR: another build of engine/ (benchmarks compare two builds in one run)
    override = os.environ.get("LAB_ENGINE_DIR")
    if override:
        alt = Path(override) / "target" / "release" / name
        if alt.is_file() and os.access(alt, os.X_OK):
            return str(alt)
        raise PreconditionError(f"LAB_ENGINE_DIR={override}: no executable {alt}")
    built = ENGINE_DIR / "target" / "release" / name
    if built.is_file() and os.access(built, os.X_OK):
        return str(built)
    found = which(name)
    if found:
        return found
    raise PreconditionError(
        f"the userspace impairment engine '{name}' is not built; run: {BUILD_COMMAND} "
        f"(expected {built} or {name} on PATH)"
    )


def engine_binary() -> str:
    """Path of lab-impaird: engine/target/release/lab-impaird, else lab-impaird on PATH."""
    return _find("lab-impaird")


def probe_binary() -> str:
    """Path of lab-probe, the UDP sequence/timestamp probe built with the engine."""
    return _find("lab-probe")


def engine_argv(
    a: str,
    b: str,
    control: str,
    config: str | None = None,
    *,
    cpu: int | None = None,
    rt_prio: int | None = None,
) -> list[str]:
    """Arguments to run the engine between interfaces `a` and `b` (run it inside the bump
    namespace, e.g. behind nsenter). `config` is a JSON file {"a2b": spec, "b2a": spec}."""
    argv = [engine_binary(), "--a", a, "--b", b, "--control", control]
    if config is not None:
        argv += ["--config", str(config)]
    if cpu is not None:
        argv += ["--cpu", str(int(cpu))]
    if rt_prio is not None:
        argv += ["--rt-prio", str(int(rt_prio))]
    return argv


def _check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise ConfigError(
            f"{direction!r} not accepted; accepted: {', '.join(DIRECTIONS)}",
            source="impairment engine",
            field="direction",
        )


class EngineClient:
    """Requests to one engine's control socket; one short connection per request."""

    def __init__(self, control_path: str | os.PathLike, *, timeout: float = 5.0):
        self.path = str(control_path)
        self.timeout = timeout

    def _exchange(self, data: bytes) -> bytes:
        """Send one request line, return the response line (StartupError: no engine there)."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(self.timeout)
                s.connect(self.path)
                s.sendall(data)
                buf = b""
                while not buf.endswith(b"\n"):
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
        except OSError as e:
            raise StartupError(f"impairment engine at {self.path} not reachable: {e}") from e
        return buf

    def _request(self, req: dict[str, Any]) -> dict[str, Any]:
        buf = self._exchange((json.dumps(req, separators=(",", ":")) + "\n").encode())
        try:
            resp = json.loads(buf)
        except ValueError as e:
            raise CommandError(
                ["lab-impaird", "control", self.path, req.get("cmd", "?")],
                -1,
                f"bad response {buf[:200]!r}",
            ) from e
        if not resp.get("ok"):
            err = resp.get("error", "unknown error")
            if req.get("cmd") == "set":
                raise ConfigError(err, source="lab-impaird", field=f"spec[{req.get('dir')}]")
            raise CommandError(["lab-impaird", "control", self.path, req.get("cmd", "?")], -1, err)
        return resp

    def ping(self) -> str:
        """The engine's version; raises StartupError when it does not answer."""
        return self._request({"cmd": "ping"}).get("version", "")

    def set(self, direction: str, spec: dict[str, Any]) -> None:
        """Replace the whole spec of `direction` ("a2b", "b2a" or "both"); {} = pass-through."""
        _check_direction(direction)
        self._request({"cmd": "set", "dir": direction, "spec": dict(spec)})

    def update(self, direction: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Set some fields and keep the others (a value of None removes the field). Returns the
        spec now in force for `direction` (for "both", each side keeps its own other fields)."""
        _check_direction(direction)
        cur = self.show()
        dirs = ("a2b", "b2a") if direction == "both" else (direction,)
        merged: dict[str, Any] = {}
        for d in dirs:
            merged = dict(cur[d]["spec"])
            for k, v in changes.items():
                if v is None:
                    merged.pop(k, None)
                else:
                    merged[k] = v
            self.set(d, merged)
        return merged

    def show(self) -> dict[str, Any]:
        """{"a2b": {"spec", "counters", "realtime"}, "b2a": {...}, "backend", "version"}."""
        resp = self._request({"cmd": "show"})
        resp.pop("ok", None)
        return resp

    def clear(self) -> None:
        """Both directions back to pass-through (counters are kept)."""
        self._request({"cmd": "clear"})

    def wait_ready(self, timeout: float = 5.0, *, proc=None, interval: float = 0.02) -> str:
        """Poll ping until the engine answers. With `proc` (its Popen), fail early with its
        stderr tail if it exits. Returns the version."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while True:
            if proc is not None and proc.poll() is not None:
                tail = ""
                if proc.stderr is not None:
                    try:
                        tail = proc.stderr.read()
                        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
                    except (OSError, ValueError):
                        tail = ""
                raise StartupError(
                    f"impairment engine exited with code {proc.returncode} before answering on "
                    f"{self.path}: {tail.strip()[-800:]}"
                )
            try:
                return self.ping()
            except StartupError as e:
                last = e
            if time.monotonic() >= deadline:
                raise StartupError(
                    f"impairment engine did not answer on {self.path} within {timeout}s: {last}"
                )
            time.sleep(interval)


def brief_traces(shown: dict[str, Any]) -> None:
    """In engines' `show` answers ({name: answer}), each spec's trace as its path and line
    count: the whole list of opportunities the engine echoes is for comparing, not for people
    (`lab impair show --json`) or records; the answer's "trace" counts what it did."""
    for ans in shown.values():
        for d in ("a2b", "b2a"):
            spec = ans.get(d, {}).get("spec") if isinstance(ans.get(d), dict) else None
            if isinstance(spec, dict) and isinstance(spec.get("trace"), dict):
                tr = spec["trace"]
                spec["trace"] = {"path": tr.get("path"), "lines": len(tr.get("ms") or [])}


#: the control socket exchange of EngineClient._exchange, run on a node with `python3 -c`
_NODE_EXCHANGE = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(float(sys.argv[2]))
try:
    s.connect(sys.argv[1])
    s.sendall(sys.stdin.buffer.read())
    buf = b""
    while not buf.endswith(b"\\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
except OSError as e:
    sys.exit(str(e))
sys.stdout.write(buf.decode(errors="replace"))
"""


class NodeEngineClient(EngineClient):
    """An engine whose control socket is on another machine (a board): each request is one
    command run on `node` (lab.core.node.Node) that talks to the socket there."""

    def __init__(self, node, control_path: str, *, timeout: float = 5.0):
        super().__init__(control_path, timeout=timeout)
        self.node = node

    def _exchange(self, data: bytes) -> bytes:
        argv = ["python3", "-I", "-S", "-c", _NODE_EXCHANGE, self.path, str(self.timeout)]
        cp = self.node.run(argv, check=False, input=data.decode(), timeout=self.timeout + 10)
        if cp.returncode != 0:
            raise StartupError(
                f"impairment engine at {self.path} on {self.node.name} not reachable: "
                f"{cp.stderr.strip()[-300:]}"
            )
        return cp.stdout.encode()
