"""Boot the full-kernel VM, run commands in it through its agent, and shut it down.

Everything a VM owns lives in its state directory, recorded in vm.json before QEMU runs so that
another process (or a later `lab down`) can attach to it or remove it:

  state_dir/vm.json        pid + start time of QEMU, kernel, accel, shares (written atomically)
  state_dir/initramfs.cpio built for this boot
  state_dir/agent.sock     QEMU's end of the agent's first virtio-serial port (the booting
                           process's); agent-N.sock for the others, agent-N.lock (flock) says
                           which one a host process holds
  state_dir/console.log    the guest's serial console
  state_dir/qemu.log       QEMU's own stderr
  state_dir/qemu.pid       QEMU's -pidfile
"""

from __future__ import annotations

from lab import REPO
import base64
import fcntl
import json
import os
import signal as _signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Self

from lab.core import proc
from lab.core.errors import CommandError, PreconditionError, StartupError, TeardownIncomplete
from lab.substrate.vm.channel import Channel, ChannelClosed, ChannelStream
from lab.substrate.vm.qemu import AGENT_PORTS

#: the checkout this code runs from (shared into the guest at the same path)
PROJECT_DIR = REPO


def agent_socket_name(i: int) -> str:
    return "agent.sock" if i == 0 else f"agent-{i}.sock"


AGENT_FILES = tuple(agent_socket_name(i) for i in range(AGENT_PORTS)) + tuple(
    f"agent-{i}.lock" for i in range(AGENT_PORTS)
)
#: How many times boot() starts the guest again after it panicked during boot under TCG
#: (see _emulator_panic); each panicked console is kept as console-panicN.log until shutdown.
TCG_BOOT_RETRIES = 1
PANIC_LOGS = tuple(f"console-panic{i}.log" for i in range(1, TCG_BOOT_RETRIES + 1))
STATE_FILES = (
    "vm.json", "initramfs.cpio", *AGENT_FILES, "qemu.pid", "console.log", "qemu.log", *PANIC_LOGS
)  # fmt: skip
DEFAULT_TMPFS = ("/tmp", "/var/run", "/var/lib/lab", "/var/log", "/var/tmp")
#: The agent runs under the host root's system python3, isolated (-I: no PYTHON* variables, no
#: user site) and without site-packages (-S: it is stdlib only, and skipping site saves ~0.3 s
#: of emulated start-up); -B: no .pyc writes; -u: its log lines reach the console at once.
AGENT_ARGV = "/usr/bin/python3 -I -S -B -u /run/lab/agent.py"


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path} not readable)"
    return "\n".join(text.splitlines()[-lines:])


class VM:
    """A running lab VM. Obtain one from boot() or VM.attach(state_dir)."""

    #: how long a new connection waits for the agent's first answer (see _chan)
    attach_timeout = 15.0

    def __init__(self, state_dir: Path, record: dict, popen: subprocess.Popen | None = None):
        self.state_dir = Path(state_dir)
        self.record = record
        self._popen = popen
        self._channel: Channel | None = None
        self._port_lock: int | None = None  # flock'd fd of the agent port this client holds

    # -- identity --------------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        return self.record["pid"]

    @property
    def console_log(self) -> Path:
        return self.state_dir / "console.log"

    @property
    def agent_socket(self) -> Path:
        return self.state_dir / "agent.sock"

    @property
    def agent_sockets(self) -> list[Path]:
        """One per agent port (a VM booted before there were several has one)."""
        n = self.record.get("agent_ports", 1)
        return [self.state_dir / agent_socket_name(i) for i in range(n)]

    def _claim_port(self, deadline: float) -> int:
        """Index of a free agent port, now flock'd by this client (freed by disconnect() or
        this process's exit); waits until `deadline` while every port is held by others."""
        while True:
            for i, _sock in enumerate(self.agent_sockets):
                fd = os.open(
                    self.state_dir / f"agent-{i}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
                )
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._port_lock = fd
                return i
            if time.monotonic() > deadline:
                raise StartupError(
                    f"all {len(self.agent_sockets)} agent channels of lab VM {self.pid} are held "
                    "by other processes (`lab shell`, `lab exec`, a run); close one and retry"
                )
            time.sleep(0.1)

    def _release_port(self) -> None:
        if self._port_lock is not None:
            os.close(self._port_lock)  # drops the flock
            self._port_lock = None

    @property
    def accel(self) -> str:
        return self.record["accel"]

    @property
    def kernel_release(self) -> str:
        return self.record["kernel"]

    @property
    def boot_seconds(self) -> float | None:
        """Host wall time from starting QEMU to the agent's first message."""
        return self.record.get("boot_seconds")

    def alive(self) -> bool:
        if self._popen is not None and self._popen.poll() is not None:
            return False
        return proc.is_same_process(self.pid, self.record.get("start_time"))

    def __repr__(self) -> str:
        return f"VM(pid={self.pid}, accel={self.accel}, kernel={self.kernel_release})"

    @classmethod
    def attach(cls, state_dir: Path) -> VM:
        """The VM recorded in `state_dir` (booted by this or another process)."""
        try:
            record = json.loads((Path(state_dir) / "vm.json").read_text())
        except (OSError, ValueError) as e:
            raise PreconditionError(f"no lab VM recorded in {state_dir}: {e}") from e
        return cls(Path(state_dir), record)

    # -- commands --------------------------------------------------------------------------------
    def _chan(self) -> Channel:
        if self._channel is None or self._channel.closed:
            if not self.alive():
                raise StartupError(
                    f"lab VM (pid {self.pid}) is not running\n{tail(self.console_log)}"
                )
            self._release_port()
            i = self._claim_port(time.monotonic() + self.attach_timeout)
            try:
                chan = Channel(self.agent_sockets[i])
            except OSError as e:
                self._release_port()
                raise StartupError(f"lab VM {self.pid}: agent port {i}: {e}") from e
            # QEMU serves one client per port; a second one connects (the kernel queues it) but
            # is never read. The lock keeps well-behaved clients apart; ask once anyway, so
            # that anything else holding the port fails clearly instead of hanging.
            if chan.request({"op": "ping"}, self.attach_timeout) is None:
                chan.close()
                self._release_port()
                raise StartupError(
                    f"the agent of lab VM {self.pid} did not answer on port {i} within "
                    f"{self.attach_timeout:.0f} s; another process may hold that channel\n"
                    + tail(self.console_log, 10)
                )
            self._channel = chan
        return self._channel

    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout: float | None = 60,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Run argv in the VM (as root, in its initial namespaces) and capture its output.

        Like lab.core.proc.run: CommandError on a non-zero exit when `check`, and always on timeout.
        The agent enforces `timeout` (killing the command's process group); the host waits a
        little longer for the reply, and treats silence beyond that as a dead agent.
        """
        argv = [str(a) for a in argv]
        req = {"op": "run", "argv": argv, "env": dict(env or {}), "timeout": timeout}
        if input is not None:
            req["input"] = input
        if cwd is not None:
            req["cwd"] = str(cwd)
        try:
            reply = self._chan().request(req, None if timeout is None else timeout + 30)
        except ChannelClosed as e:
            raise CommandError(argv, -1, f"{e}\n{tail(self.console_log, 10)}", where="vm") from e
        if reply is None:
            raise CommandError(argv, -1, f"no reply from the VM agent within {timeout}s + 30s",
                               where="vm")  # fmt: skip
        if "error" in reply:
            raise CommandError(argv, -1, f"agent: {reply['error']}", where="vm")
        if reply.get("timed_out"):
            raise CommandError(argv, -1, f"timed out after {timeout}s\n{reply.get('stderr', '')}",
                               where="vm", stdout=reply.get("stdout", ""))  # fmt: skip
        cp = subprocess.CompletedProcess(argv, reply["rc"], reply["stdout"], reply["stderr"])
        if check and cp.returncode != 0:
            raise CommandError(argv, cp.returncode, cp.stderr, where="vm", stdout=cp.stdout)
        return cp

    def start_stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        tty: bool = False,
        rows: int = 24,
        cols: int = 80,
    ) -> Stream:
        """Start argv in the VM (as root, in a new session) and return at once; its output
        arrives as it is written (Stream.events), its stdin comes from Stream.write.

        With `tty` the command gets a fresh pseudo-terminal of `rows` x `cols` as its
        controlling terminal (stdout and stderr merged, as on a terminal; TERM=xterm unless
        `env` sets it); otherwise stdin, stdout and stderr are pipes. There is no timeout: stop
        the command with Stream.signal. Disconnecting this client hangs it up (SIGHUP).
        """
        argv = [str(a) for a in argv]
        req = {
            "op": "stream",
            "argv": argv,
            "env": dict(env or {}),
            "tty": bool(tty),
            "rows": int(rows),
            "cols": int(cols),
        }
        if cwd is not None:
            req["cwd"] = str(cwd)
        try:
            chan = self._chan().open_stream(req)
        except ChannelClosed as e:
            raise CommandError(argv, -1, f"{e}\n{tail(self.console_log, 10)}", where="vm") from e
        return Stream(self, argv, chan)

    def disconnect(self) -> None:
        """Close this client's connection and free its agent port (the VM keeps running)."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        self._release_port()

    def ping(self, timeout: float = 5.0) -> dict | None:
        """The agent's pong ({"kernel", "uptime"}), or None if it did not answer in time."""
        try:
            return self._chan().request({"op": "ping"}, timeout)
        except (ChannelClosed, OSError):
            return None

    # -- shutdown --------------------------------------------------------------------------------
    def shutdown(self, *, grace: float = 15.0, keep_logs: bool = False) -> None:
        """Power the guest off, wait up to `grace` s, then stop QEMU by PID (TERM, then KILL),
        and remove the state files (the console and QEMU logs too unless `keep_logs`).

        Harmless to call twice. Raises TeardownIncomplete naming whatever is left.
        """
        leftovers: list[str] = []
        if self.alive():
            try:
                chan = self._chan()
                chan.request({"op": "poweroff"}, min(grace, 5.0))
            except (OSError, StartupError):
                pass  # the agent is gone or wedged: QEMU is stopped by PID below
            deadline = time.monotonic() + grace
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
        self.disconnect()
        if self.alive() and not proc.stop_pid(self.pid, self.record.get("start_time")):
            leftovers.append(f"QEMU process {self.pid}")
        if self._popen is not None:
            try:
                self._popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        keep = {"console.log", "qemu.log"} if keep_logs else set()
        for name in STATE_FILES:
            if name in keep:
                continue
            path = self.state_dir / name
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                leftovers.append(f"{path}: {e.strerror}")
        try:
            self.state_dir.rmdir()
        except OSError:
            pass  # not empty (kept logs, or the caller's own files): not ours to remove
        if leftovers:
            raise TeardownIncomplete(leftovers)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


class Stream:
    """A command started by VM.start_stream, still running or finished.

    One consumer reads its output (events or wait); write, close_stdin, signal and resize may be
    called from any thread, even while another one reads, and never wait for the guest. They do
    nothing once the command is done. Channel failures (QEMU gone, agent restarted, or a VM
    booted with an agent that predates streams) raise CommandError(where="vm").

    As a context manager, leaving the block while the command still runs hangs it up (SIGHUP
    to its process group) and stops listening to it.
    """

    def __init__(self, vm: VM, argv: list[str], chan: ChannelStream):
        self.vm = vm
        self.argv = argv
        self._chan = chan
        #: the exit status once done (128 + n if killed by signal n); None while it runs
        self.returncode: int | None = None
        self._error: CommandError | None = None

    # -- input and control -----------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        """Send `data` to the command's stdin (in tty mode: typed on its terminal, so b"\x03"
        is Ctrl-C)."""
        if data:
            self._post("input", data=base64.b64encode(data).decode("ascii"))

    def close_stdin(self) -> None:
        """End of input: closes the command's stdin pipe. In tty mode the terminal's EOF
        character (normally Ctrl-D) is typed instead, which ends input at the start of a line."""
        self._post("input", eof=True)

    def signal(self, sig: int) -> None:
        """Send signal `sig` to the command's process group (the group it started in)."""
        self._post("signal", sig=int(sig))

    def resize(self, rows: int, cols: int) -> None:
        """Set the terminal size (tty mode; ignored otherwise); the kernel sends SIGWINCH."""
        self._post("resize", rows=int(rows), cols=int(cols))

    def _post(self, op: str, **fields) -> None:
        if self.returncode is not None or self._error is not None:
            return
        try:
            self._chan.post(op, **fields)
        except ChannelClosed as e:
            raise self._fail(f"{e}\n{tail(self.vm.console_log, 10)}") from e

    # -- output ----------------------------------------------------------------------------------
    def events(self, timeout: float | None = None) -> Iterator[tuple[int, bytes]]:
        """Yield (fd, data) as the command writes (fd 1 or 2; always 1 in tty mode) until it has
        exited and its output is drained; then returncode is set.

        `timeout` bounds the whole iteration: subprocess.TimeoutExpired if the command is not
        done by then (it keeps running; iterate again, or signal it).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            if self._error is not None:
                raise self._error
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                msg = self._chan.get(left)
            except ChannelClosed as e:
                raise self._fail(f"{e}\n{tail(self.vm.console_log, 10)}") from e
            if msg is None:
                raise subprocess.TimeoutExpired(self.argv, timeout)
            if "out" in msg:
                yield int(msg.get("fd", 1)), base64.b64decode(msg["out"])
            elif msg.get("done"):
                self.returncode = int(msg["rc"])
            elif "error" in msg:
                why = str(msg["error"])
                if "unknown op 'stream'" in why:
                    why += " (this VM was booted with an older agent: restart it)"
                raise self._fail(f"agent: {why}")

    def wait(self, timeout: float | None = None) -> int:
        """The exit status, once the command is done; output not read yet is discarded.
        subprocess.TimeoutExpired if not done within `timeout` s."""
        for _ in self.events(timeout):
            pass
        return self.returncode

    def _fail(self, why: str) -> CommandError:
        self._error = CommandError(self.argv, -1, why, where="vm")
        return self._error

    # -- ending ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Hang the command up (SIGHUP to its group) if it still runs, and stop listening."""
        if self.returncode is None and self._error is None:
            try:
                self.signal(_signal.SIGHUP)
            except CommandError:
                pass
        self._chan.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Stream({self.argv!r}, returncode={self.returncode})"


def write_record(state_dir: Path, record: dict) -> None:
    tmp = state_dir / "vm.json.tmp"
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, state_dir / "vm.json")
