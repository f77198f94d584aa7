"""BoardNode: a lab Node on a real board reached with OpenSSH, through one ssh session per board.

A new SSH exec channel costs ~100 ms (the server's side of the session set-up), so commands do
not get one each: BoardConnection starts ONE `ssh HOST python3 ... --stdio` per board, sends the
lab agent's source (lab.substrate.vm.agentscript.agent_source()) down its stdin, and then speaks the agent protocol over that
session with lab.substrate.vm.channel.Channel, as the VM does over virtio-serial (~1 ms a command). Nothing
is installed on the board; the agent exits when the session's stdin closes.

The user's ~/.ssh/config, ssh-agent and known_hosts stay in force: ssh_argv adds only batch mode
and keep-alives, and never weakens host key checking.
"""

from __future__ import annotations

import base64
import codecs
import io
import json
import os
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from lab.core import proc
from lab.core.errors import CommandError, StartupError
from lab.core.node import Daemon, Node
from lab.core.state import Ledger
from lab.substrate.vm.agentscript import agent_source
from lab.substrate.vm.channel import Channel, ChannelClosed
from lab.substrate.boards.types import Board

#: the interpreter flags of the agent: isolated, no site, no .pyc, unbuffered (as in the VM)
PYTHON = ["python3", "-I", "-S", "-B", "-u"]
#: reads an 11-byte header (10-digit byte count + newline) then exactly that many bytes of
#: source from fd 0 and runs them as __main__. os.read, not sys.stdin: a buffered reader would
#: read ahead into the protocol lines that follow. One line: the remote login shell may be any.
BOOT = (
    'import os,sys;r=lambda n,b=b"":b if len(b)>=n else r(n,b+(os.read(0,n-len(b)) or '
    'sys.exit("lab-agent bootstrap: stdin closed")));s=r(int(r(11)));'
    'exec(compile(s,"lab-agent","exec"),{"__name__":"__main__"})'
)
#: what ssh runs on the board (sudo -n is prefixed by ssh_argv for become="sudo")
AGENT_COMMAND = [*PYTHON, "-c", BOOT, "--stdio"]

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


def ssh_argv(board: Board, command: Sequence[str]) -> list[str]:
    """The ssh command line that runs `command` on `board`.

    The inventory's own ssh_options come first: OpenSSH keeps the first value it gets for each
    option, so an inventory may override our batch mode or keep-alives. Host key checking is
    never relaxed here; the user's ssh_config and known_hosts apply as for any ssh.
    """
    argv = ["ssh", "-T"]
    for opt in board.ssh_options:
        argv += ["-o", opt]
    argv += ["-o", "BatchMode=yes", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
    # a board that is off or unplugged: say so in seconds, not after TCP's two minutes
    argv += ["-o", "ConnectTimeout=10"]
    if board.port is not None:
        argv += ["-p", str(board.port)]
    if board.user:
        argv += ["-l", board.user]
    if board.key:
        argv += ["-i", board.key, "-o", "IdentitiesOnly=yes"]
    remote = list(command)
    if board.become == "sudo":
        remote = ["sudo", "-n", *remote]
    # ssh hands the remote side one string for the login shell to parse
    return [*argv, "--", board.host, shlex.join(remote)]


def _tail(path: Path, lines: int = 10) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


class BoardConnection:
    """One ssh session to one board carrying the lab agent: open it once per controller
    process and share it between the board's nodes."""

    def __init__(self, board: Board, ssh: subprocess.Popen, channel: Channel, log_path: Path):
        self.board = board
        self.ssh = ssh
        self.channel = channel
        self.log_path = log_path

    def __repr__(self) -> str:
        return f"BoardConnection({self.board.name}: {self.board.host})"

    @classmethod
    def open(
        cls,
        board: Board,
        *,
        log_path: Path,
        connect_timeout: float = 60.0,
        command: Callable[[Board, list[str]], list[str]] = ssh_argv,
    ) -> BoardConnection:
        """Start ssh and the agent on `board`; StartupError (with ssh's stderr from `log_path`)
        if the agent is not ready within `connect_timeout` s. `command` makes the local argv
        from the remote one (tests run the agent without ssh)."""
        argv = command(board, AGENT_COMMAND)
        src = agent_source()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair()
        with open(log_path, "ab") as log:
            try:
                ssh = subprocess.Popen(argv, stdin=theirs, stdout=theirs, stderr=log)
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
        where = f"board {board.name} ({board.host})"
        try:
            # The source goes first: Channel() sends its "hello" line at once, and the bootstrap
            # must find exactly the source before the protocol begins.
            ours.sendall(f"{len(src):010d}\n".encode() + src)
            channel = Channel(None, sock=ours)
        except OSError as e:
            # ssh exited (refused) before taking the source: report it as the case below does,
            # once ssh has written all of its stderr
            ours.close()
            rc = cls._end(ssh)
            raise StartupError(
                f"{where}: ssh exited {rc} ({e.strerror}): {shlex.join(argv)}\n{_tail(log_path)}"
            ) from e
        deadline = time.monotonic() + connect_timeout
        while channel.wait_event("ready", 0.05) is None:
            if channel.closed or ssh.poll() is not None or time.monotonic() > deadline:
                # judged before closing: closing ends the agent, and ssh with it
                timed_out = not channel.closed and ssh.poll() is None
                channel.close()
                rc = cls._end(ssh)
                why = (
                    f"no agent within {connect_timeout:.0f} s"
                    if timed_out or rc is None
                    else f"ssh exited {rc}"
                )
                raise StartupError(f"{where}: {why}: {shlex.join(argv)}\n{_tail(log_path)}")
        return cls(board, ssh, channel, log_path)

    @staticmethod
    def _end(ssh: subprocess.Popen, wait: float = 5.0) -> int | None:
        """Wait for ssh to exit, then TERM/KILL it; its exit code if it exited by itself."""
        try:
            return ssh.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
        for stop in (ssh.terminate, ssh.kill):
            stop()
            try:
                ssh.wait(timeout=2)
                break
            except subprocess.TimeoutExpired:
                continue
        return None

    def alive(self) -> bool:
        return self.ssh.poll() is None and not self.channel.closed

    def ping(self, timeout: float = 5.0) -> dict | None:
        """The agent's pong ({"kernel", "uptime"}), or None if it did not answer in time."""
        try:
            return self.channel.request({"op": "ping"}, timeout)
        except ChannelClosed:
            return None

    def close(self) -> None:
        """End the session: EOF on the agent's stdin (it hangs up its streams and exits), then
        ssh exits. Daemons spawned on the board keep running. Harmless to call twice."""
        try:
            self.channel.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._end(self.ssh, wait=10.0)
        self.channel.close()


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
                argv, -1, f"{e}\n{_tail(self.conn.log_path)}", where=self.where
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
                argv, -1, f"{e}\n{_tail(self.conn.log_path)}", where=self.where
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
