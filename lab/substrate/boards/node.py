"""BoardNode: a lab Node on a real board, its commands sent over the board's one ssh session
(lab.substrate.boards.connection.BoardConnection) to the lab agent there.

Commands run from the agent's BASE_ENV plus the node's and the call's variables; daemons are
spawned, stopped and checked with small board-side Python helpers (one round trip each) and
recorded in the ledger; files the drivers render on the controller are copied over (sync);
popen streams a command's output back (lab.substrate.boards.process.BoardProcess).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from lab.core import proc
from lab.core.errors import CommandError
from lab.core.node import Daemon, Node
from lab.core.state import Ledger
from lab.substrate.boards.connection import PYTHON, BoardConnection, log_tail
from lab.substrate.boards.process import BoardProcess
from lab.substrate.vm.channel import ChannelClosed

# Board-side helpers, run by the agent as `python3 -I -S -c HELPER args...` (one round trip).
_MKDIRS = """
import os
def mkdirs(d):
    if d and not os.path.isdir(d):
        mkdirs(os.path.dirname(d))
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
"""
#: argv: LOG ARGV... (LOG "" for none); prints the PID and the /proc/PID/stat line
_SPAWN = (
    _MKDIRS
    + """
import subprocess, sys
log = sys.argv[1]
if log:
    mkdirs(os.path.dirname(log))
    out = open(log, "ab")
else:
    out = subprocess.DEVNULL
try:
    p = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=out,
                         stderr=subprocess.STDOUT, start_new_session=True)
except OSError as e:
    sys.exit(f"{sys.argv[2]}: {e.strerror}")
print(p.pid)
try:
    print(open(f"/proc/{p.pid}/stat").read())
except OSError:
    pass
"""
)
#: argv: PID START_TIME|"" GRACE; TERM, wait, KILL, only while the start time matches
_STOP = """
import os, sys, time
pid, start, grace = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
def same():
    try:
        d = open(f"/proc/{pid}/stat", "rb").read()
    except OSError:
        return False
    rest = d[d.rindex(b")") + 2:].split()
    return rest[0] != b"Z" and (not start or int(rest[19]) == int(start))
for sig, wait in ((15, grace), (9, 2.0)):
    if not same():
        break
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        break
    end = time.monotonic() + wait
    while same() and time.monotonic() < end:
        time.sleep(0.01)
print("alive" if same() else "gone")
"""
#: stdin: JSON list of {"path", "mode", "data" (base64)}; each written atomically
_PUT = (
    _MKDIRS
    + """
import base64, json, sys
for f in json.load(sys.stdin):
    path = f["path"]
    mkdirs(os.path.dirname(path))
    tmp = f"{path}.lab-tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as o:
        o.write(base64.b64decode(f["data"]))
    os.chmod(tmp, f["mode"])
    os.replace(tmp, path)
"""
)
#: prints its own PID on stderr, then becomes the command (popen learns the command's PID)
_PID_THEN_EXEC = 'echo "$$" >&2; exec "$@"'


def _board_env(*layers: Mapping[str, str | None] | None) -> dict[str, str]:
    """Only the variables the node and the call set (None removes one): the board's process
    starts from the agent's BASE_ENV, never from the controller's environment."""
    env: dict[str, str] = {}
    for layer in layers:
        for k, v in (layer or {}).items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
    return env


class BoardNode(Node):
    def __init__(
        self,
        name: str,
        conn: BoardConnection,
        *,
        ledger: Ledger | None = None,
        log_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
        sync_dirs: Iterable[Path] = (),
    ):
        self.name = name
        self.conn = conn
        self.ledger = ledger
        self.log_dir = log_dir
        self.env = dict(env or {})
        self.sync_dirs = [Path(d) for d in sync_dirs]
        self._synced: dict[Path, tuple[int, int]] = {}
        self._sync_lock = threading.Lock()
        board = conn.board.name
        self.where = f"board {board}" if board == name else f"board {board} (node {name})"

    def __repr__(self) -> str:
        return f"BoardNode({self.name} on {self.conn.board.name})"

    # ------------------------------------------------------------------ commands
    def run(self, argv, *, check=True, timeout=60, input=None, env=None):
        self.sync()
        return self._run(argv, check=check, timeout=timeout, input=input, env=env)

    def _run(self, argv, *, check=True, timeout=60, input=None, env=None):
        argv = [str(a) for a in argv]
        req = {"op": "run", "argv": argv, "env": _board_env(self.env, env), "timeout": timeout}
        if input is not None:
            req["input"] = input
        try:
            # the agent enforces `timeout`; silence well beyond it means a dead session
            reply = self.conn.channel.request(req, None if timeout is None else timeout + 30)
        except ChannelClosed as e:
            raise CommandError(
                argv, -1, f"{e}\n{log_tail(self.conn.log_path)}", where=self.where
            ) from e
        if reply is None:
            raise CommandError(argv, -1, f"no reply from the board's agent within {timeout}s + 30s",
                               where=self.where)  # fmt: skip
        if "error" in reply:
            raise CommandError(argv, -1, f"agent: {reply['error']}", where=self.where)
        if reply.get("timed_out"):
            raise CommandError(argv, -1, f"timed out after {timeout}s\n{reply.get('stderr', '')}",
                               where=self.where, stdout=reply.get("stdout", ""))  # fmt: skip
        cp = subprocess.CompletedProcess(argv, reply["rc"], reply["stdout"], reply["stderr"])
        if check and cp.returncode != 0:
            raise CommandError(argv, cp.returncode, cp.stderr, where=self.where, stdout=cp.stdout)
        return cp

    def _python(self, script: str, *args, timeout: float = 60, input: str | None = None):
        return self._run([*PYTHON, "-c", script, *map(str, args)], timeout=timeout, input=input)

    def spawn(self, name, argv, *, log=None, env=None):
        self.sync()
        if log is None and self.log_dir is not None:
            log = self.log_dir / f"{self.name}-{name}.log"
        board = self.conn.board.name
        if self.ledger is not None:
            # intent first: if we die before the PID line, teardown knows a process may exist
            self.ledger.record("process-intent", node=self.name, name=name, board=board)
        argv = [str(a) for a in argv]
        cp = self._run([*PYTHON, "-c", _SPAWN, str(log or ""), *argv], env=env, timeout=30)
        pid_line, _, stat = cp.stdout.partition("\n")
        pid, st = int(pid_line), proc.parse_start_time(stat)
        if self.ledger is not None:
            self.ledger.record("process", node=self.name, name=name, pid=pid, start_time=st,
                               argv=argv, board=board)  # fmt: skip
        return Daemon(self.name, name, pid, st, log, where=self)

    def stop(self, daemon: Daemon, *, grace: float = 3.0) -> bool:
        cp = self._python(_STOP, daemon.pid, daemon.start_time or "", grace, timeout=grace + 10)
        gone = cp.stdout.strip() == "gone"
        if self.ledger is not None and gone:
            self.ledger.record("process-stopped", node=self.name, name=daemon.name, pid=daemon.pid)
        return gone

    def popen(self, argv, *, stdout=None, stderr=None, env=None, stdin=None):
        if stdin not in (None, subprocess.DEVNULL):
            raise ValueError(f"{self.where}: popen's stdin can only be None or DEVNULL")
        self.sync()
        argv = [str(a) for a in argv]
        req = {"op": "stream", "argv": ["sh", "-c", _PID_THEN_EXEC, "sh", *argv],
               "env": _board_env(self.env, env)}  # fmt: skip
        try:
            stream = self.conn.channel.open_stream(req)
            stream.post("input", eof=True)
        except ChannelClosed as e:
            raise CommandError(
                argv, -1, f"{e}\n{log_tail(self.conn.log_path)}", where=self.where
            ) from e
        return BoardProcess(argv, stream, stdout, stderr)

    # ------------------------------------------------------------------ asked on the board
    def is_alive(self, pid: int, start_time: int | None) -> bool:
        cp = self._run(["cat", f"/proc/{pid}/stat"], check=False, timeout=30)
        st = proc.parse_start_time(cp.stdout) if cp.returncode == 0 else None
        return st is not None and (start_time is None or st == start_time)

    def read_text(self, path: Path | str) -> str:
        """The text of file `path` on the board ("" if it cannot be read)."""
        cp = self._run(["cat", str(path)], check=False, timeout=30)
        return cp.stdout if cp.returncode == 0 else ""

    def put_file(self, path: Path | str, data: bytes, mode: int = 0o600) -> None:
        """Write `data` to `path` on the board (atomically; new parent directories 0700)."""
        self.put_files({Path(path): (data, mode)})

    def put_files(self, files: Mapping[Path, tuple[bytes, int]]) -> None:
        """Write several files in one round trip: {path: (data, mode)}."""
        if not files:
            return
        items = [
            {"path": str(p), "mode": mode, "data": base64.b64encode(data).decode("ascii")}
            for p, (data, mode) in files.items()
        ]
        self._python(_PUT, timeout=120, input=json.dumps(items))

    def sync(self) -> None:
        """Copy every file under sync_dirs that is new or changed since its last copy to the
        same path on the board (the configs and secrets drivers render on the controller).
        Files removed here are not removed there."""
        if not self.sync_dirs:
            return
        with self._sync_lock:
            changed: dict[Path, tuple[bytes, int]] = {}
            seen: dict[Path, tuple[int, int]] = {}
            for top in self.sync_dirs:
                for dirpath, _, names in os.walk(top):
                    for n in names:
                        p = Path(dirpath) / n
                        try:
                            st = p.stat()
                        except OSError:
                            continue  # removed while we walked
                        key = (st.st_mtime_ns, st.st_size)
                        if self._synced.get(p) != key and p.is_file():
                            changed[p] = (p.read_bytes(), st.st_mode & 0o7777)
                            seen[p] = key
            if changed:
                self.put_files(changed)
                self._synced.update(seen)

    def private_mounts(self) -> bool:
        return False
