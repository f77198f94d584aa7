"""Streaming and interactive commands through the VM agent, without a VM.

The real agent (the script that ships, lab.substrate.vm.agentscript.agent_source(), run as the
guest runs it: the system python3, -I -S) serves one end of a socket pair; the other end is a
real Channel inside a real VM object, so VM.start_stream, Stream and terminal.attach run
unchanged against it. Commands run on this host.
"""

from __future__ import annotations

import base64
import fcntl
import io
import os
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from lab.core.errors import CommandError
from lab.substrate.vm.agentscript import agent_source
from lab.substrate.vm.channel import Channel, ChannelClosed
from lab.substrate.vm.machine import VM
from lab.substrate.vm.terminal import attach

PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def _like_the_guest_init() -> None:
    # The init starts the agent in the background of a non-interactive shell: SIGINT and
    # SIGQUIT ignored. (Runs in the child before exec; the agent must undo this for commands.)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


class AgentHarness:
    """The agent in its own process, serving a socket pair; `vm` is a VM on the other end."""

    def __init__(self, tmp_path: Path):
        agent = tmp_path / "agent.py"
        agent.write_bytes(agent_source())  # the one script, as the VM and boards get it
        host, guest = socket.socketpair()
        self.log = open(tmp_path / "agent.log", "wb")  # closed in stop()
        self.proc = subprocess.Popen(
            [PYTHON, "-I", "-S", "-B", "-u", str(agent), "--fd", str(guest.fileno())],
            pass_fds=[guest.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            preexec_fn=_like_the_guest_init,
        )
        guest.close()
        self.channel = Channel(None, sock=host)
        assert self.channel.wait_event("ready", 30) is not None, "agent did not start"
        # pid: only for VM.alive(), never consulted while the channel is open
        self.vm = VM(tmp_path, {"pid": os.getpid(), "accel": "none", "kernel": "host"})
        self.vm._channel = self.channel

    def stop(self) -> None:
        self.channel.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def harness(tmp_path):
    h = AgentHarness(tmp_path)
    yield h
    h.stop()


@pytest.fixture
def vm(harness):
    return harness.vm


def collect(stream, timeout=30):
    out = {1: b"", 2: b""}
    for fd, data in stream.events(timeout):
        out[fd] += data
    return out


def wait_for(pred, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def process_gone(pid: int) -> bool:
    """Not running: absent, or a zombie waiting for its (re)parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


# -- pipe mode --------------------------------------------------------------------------------------
def test_output_arrives_while_the_command_runs(vm):
    s = vm.start_stream(["sh", "-c", "echo a; read x; echo b"])
    it = s.events(30)
    # "a" arrives while the command still waits for our input: not held back until it ends
    assert next(it) == (1, b"a\n")
    s.write(b"\n")
    assert b"".join(d for _, d in it) == b"b\n"
    assert s.returncode == 0


def test_stdout_and_stderr_stay_apart_and_binary(vm):
    s = vm.start_stream(["sh", "-c", r"echo out; echo err >&2; printf '\000\377x'; exit 4"])
    out = collect(s)
    assert out == {1: b"out\n\x00\xffx", 2: b"err\n"}
    assert s.returncode == 4
    big = vm.start_stream(["head", "-c", "300000", "/dev/zero"])
    assert collect(big)[1] == b"\0" * 300000


def test_stdin_is_forwarded_interactively_then_closed(vm):
    s = vm.start_stream(["cat"])
    s.write(b"one\n")
    it = s.events(30)
    assert next(it) == (1, b"one\n")  # echoed back while cat still runs
    assert s.returncode is None
    s.write(b"two\n")
    s.close_stdin()
    assert b"".join(d for _, d in it) == b"two\n"
    assert s.returncode == 0
    w = vm.start_stream(["wc", "-c"])
    for _ in range(4):
        w.write(b"x" * 50000)
    w.close_stdin()
    assert collect(w)[1].strip() == b"200000"


def test_env_and_cwd(vm, tmp_path):
    s = vm.start_stream(["sh", "-c", "echo $FOO $TERM; pwd"], env={"FOO": "bar"}, cwd=tmp_path)
    assert collect(s)[1] == f"bar dumb\n{tmp_path}\n".encode()


def test_exit_status_and_death_by_signal(vm):
    assert vm.start_stream(["sh", "-c", "exit 7"]).wait(30) == 7
    assert vm.start_stream(["sh", "-c", "kill -TERM $$"]).wait(30) == 128 + signal.SIGTERM
    assert vm.start_stream(["sh", "-c", "kill -KILL $$"]).wait(30) == 128 + signal.SIGKILL
    missing = vm.start_stream(["/nonexistent/tool"])
    out = collect(missing)
    assert missing.returncode == 127 and b"No such file" in out[2]
    bad_env = vm.start_stream(["true"], env={"X": None})  # refused by the agent, which lives on
    assert bad_env.wait(30) == 127
    assert vm.run(["true"]).returncode == 0


def test_signal_reaches_the_whole_process_group(vm):
    s = vm.start_stream(["sh", "-c", "sleep 100 & echo $!; echo $$; wait; echo never"])
    it = s.events(30)
    text = b""
    while text.count(b"\n") < 2:
        text += next(it)[1]
    pids = [int(x) for x in text.split()]
    s.signal(signal.SIGTERM)
    assert s.wait(30) == 128 + signal.SIGTERM
    wait_for(lambda: all(process_gone(p) for p in pids), what=f"{pids} to die")


def test_wait_timeout_leaves_the_command_running(vm):
    s = vm.start_stream(["sleep", "100"])
    with pytest.raises(subprocess.TimeoutExpired):
        s.wait(0.3)
    assert s.returncode is None
    s.signal(signal.SIGKILL)
    assert s.wait(30) == 128 + signal.SIGKILL
    s.signal(signal.SIGTERM)  # after the end: nothing happens


def test_concurrent_streams_and_runs(vm):
    streams = [vm.start_stream(["sh", "-c", f"sleep 0.5; echo {i}"]) for i in range(5)]
    assert vm.run(["echo", "run"]).stdout == "run\n"  # a plain request is not held up
    assert [collect(s)[1] for s in streams] == [f"{i}\n".encode() for i in range(5)]


# -- tty mode ---------------------------------------------------------------------------------------
def test_tty_mode_terminal_size_and_resize(vm):
    s = vm.start_stream(
        ["sh", "-c", "tty; echo $TERM; stty size; echo err >&2; read x; stty size; echo got $x"],
        tty=True,
        rows=33,
        cols=101,
    )
    it = s.events(30)
    text = b""
    while b"err" not in text:
        fd, data = next(it)
        assert fd == 1  # a terminal has one output
        text += data
    lines = text.decode().splitlines()
    assert lines[0].startswith("/dev/pts/"), lines
    assert lines[1:4] == ["xterm", "33 101", "err"]
    s.resize(40, 120)
    time.sleep(0.2)  # the resize and the input are separate messages, handled in order
    s.write(b"hello\r")  # typed: the terminal's ICRNL makes it a newline
    rest = b"".join(d for _, d in it).decode()
    assert "40 120" in rest and "got hello" in rest, rest
    assert s.returncode == 0


def test_tty_ctrl_c_and_eof_go_through_the_line_discipline(vm):
    s = vm.start_stream(["sh", "-c", "echo ready; exec sleep 100"], tty=True)
    it = s.events(30)
    assert b"ready" in next(it)[1]
    time.sleep(0.3)  # until `exec sleep` has happened
    s.write(b"\x03")  # Ctrl-C: the guest's terminal turns it into SIGINT
    for _ in it:
        pass
    assert s.returncode == 128 + signal.SIGINT
    c = vm.start_stream(["cat"], tty=True, env={"TERM": "vt100"})
    c.write(b"abc\r")
    c.close_stdin()  # types VEOF (^D) at the start of a line: cat sees end of file
    out = collect(c)[1]
    assert c.returncode == 0 and out.count(b"abc") == 2  # the echo, then cat's copy


def test_tty_stream_ends_when_the_command_exits(vm):
    """A background process keeping the terminal open does not hold the stream (as with ssh)."""
    t0 = time.monotonic()
    s = vm.start_stream(["sh", "-c", "trap '' HUP; (trap '' HUP; sleep 20) & echo bye"], tty=True)
    assert b"bye" in collect(s)[1]
    assert time.monotonic() - t0 < 20  # ended before the background sleep did


# -- control ops, hang-up, failures ------------------------------------------------------------------
def test_control_for_an_unknown_stream_is_harmless(harness):
    ch = harness.channel
    ch.post({"op": "input", "target": "nope", "data": base64.b64encode(b"x").decode()})
    ch.post({"op": "signal", "target": "nope", "sig": 9})
    reply = ch.request({"op": "signal", "target": "nope", "sig": 9}, 30)  # with an id: answered
    assert "no running stream" in reply["error"]
    assert ch.request({"op": "ping"}, 30)["pong"] is True


def test_host_disconnect_hangs_up_running_streams(harness, tmp_path):
    vm = harness.vm
    marks = []
    streams = []
    for i, tty in enumerate((False, True)):
        mark = tmp_path / f"hup{i}"
        script = f"trap 'echo hup >{mark}; exit 0' HUP; echo ready; while :; do sleep 0.1; done"
        s = vm.start_stream(["sh", "-c", script], tty=tty)
        assert b"ready" in next(s.events(30))[1]
        marks.append(mark)
        streams.append(s)
    waiting = []

    def waiter():
        try:
            streams[0].wait()
        except CommandError as e:
            waiting.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    harness.channel.close()  # like the host CLI going away
    t.join(10)
    assert not t.is_alive(), "a reader waiting on a stream was not woken by the close"
    assert waiting and "channel closed" in str(waiting[0]) and waiting[0].where == "vm"
    wait_for(lambda: all(m.exists() for m in marks), what="SIGHUP in both streams")
    assert harness.proc.wait(timeout=15) == 0


def test_a_new_client_hangs_up_the_previous_ones_streams(harness, tmp_path):
    """Under TCG a host may reconnect before the agent saw the EOF: its hello says it."""
    mark = tmp_path / "hup"
    # the shell waits in its own `read`, not in a child: a SIGHUP that reached a forked child
    # between fork and exec would be taken by the inherited trap and lost (the test's race)
    s = harness.vm.start_stream(
        ["sh", "-c", f"trap 'echo x >{mark}; exit' HUP; echo r; while :; do read -r x; done"]
    )
    assert next(s.events(30))[1] == b"r\n"
    harness.channel.post({"op": "hello", "client": "next"})
    wait_for(mark.exists, what="SIGHUP on hello")
    later = harness.vm.start_stream(["echo", "after"])  # streams after the hello are its own
    assert collect(later)[1] == b"after\n"


def test_channel_stream_raises_channel_closed(harness):
    st = harness.channel.open_stream({"op": "stream", "argv": ["sleep", "100"]})
    harness.channel.close()
    with pytest.raises(ChannelClosed):
        st.get(10)
    with pytest.raises(ChannelClosed):
        st.get(0)
    with pytest.raises(ChannelClosed):
        harness.channel.open_stream({"op": "stream", "argv": ["true"]})


def test_stream_context_manager_hangs_up(vm, tmp_path):
    mark = tmp_path / "hup"
    argv = ["sh", "-c", f"trap 'echo x >{mark}; exit' HUP; echo r; while :; do read -r x; done"]
    with vm.start_stream(argv) as s:  # a builtin wait, as above
        assert next(s.events(30))[1] == b"r\n"
    wait_for(mark.exists, what="SIGHUP on leaving the with-block")


# -- terminal.attach --------------------------------------------------------------------------------
def test_attach_pipe_mode_with_files(vm):
    out, err = io.BytesIO(), io.BytesIO()
    rc = attach(
        vm,
        ["sh", "-c", "tr a-z A-Z; echo done >&2; exit 3"],
        stdin=io.BytesIO(b"hello\nworld\n"),
        stdout=out,
        stderr=err,
    )
    assert (rc, out.getvalue(), err.getvalue()) == (3, b"HELLO\nWORLD\n", b"done\n")


def test_attach_pipe_mode_with_fds_relays_live(vm, tmp_path):
    r, w = os.pipe()
    os.close(w)  # stdin at EOF at once
    gate = tmp_path / "a-was-relayed"  # the agent runs on this host: same file system
    writes = []

    class Recorder(io.RawIOBase):
        def writable(self):
            return True

        def write(self, b):
            writes.append(bytes(b))
            if b"a" in b:
                gate.touch()
            return len(b)

    # after "a", the command waits (up to 30 s) for the proof that "a" reached our stdout
    script = (
        f"cat; echo a; i=0; while [ ! -e {gate} ] && [ $i -lt 600 ]; do sleep 0.05; "
        f"i=$((i+1)); done; if [ -e {gate} ]; then echo b; else echo late; fi"
    )
    rc = attach(vm, ["sh", "-c", script], stdin=r, stdout=Recorder())
    os.close(r)
    assert rc == 0
    assert b"".join(writes) == b"a\nb\n", "output was not relayed as it came"


def test_attach_forwards_sigint_instead_of_raising(vm):
    before = signal.getsignal(signal.SIGINT)
    out = io.BytesIO()

    class Watch(io.BytesIO):
        def write(self, b):
            if b"ready" in b:
                threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
            return out.write(b)

    script = "trap 'echo got INT; exit 5' INT; echo ready; while :; do sleep 0.1; done"
    rc = attach(vm, ["sh", "-c", script], stdin=io.BytesIO(), stdout=Watch(), stderr=io.BytesIO())
    assert rc == 5 and b"got INT" in out.getvalue()
    assert signal.getsignal(signal.SIGINT) is before


def test_attach_tty_mode_on_a_host_terminal(vm):
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))
    before = termios.tcgetattr(slave)
    winch_before = signal.getsignal(signal.SIGWINCH)
    seen = bytearray()
    steps = []

    def host_terminal():
        """The user: reads the screen; once the command is ready, resizes and types."""
        acted = False
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                return
            if not data:
                return
            seen.extend(data)
            if not acted and b"ready" in seen:
                acted = True
                raw = termios.tcgetattr(slave)
                steps.append(raw[3] & termios.ICANON == 0 and raw[3] & termios.ECHO == 0)
                fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
                os.kill(os.getpid(), signal.SIGWINCH)  # what the kernel sends the foreground
                time.sleep(0.5)
                os.write(master, b"go\r")
            if b"END" in seen:
                return

    t = threading.Thread(target=host_terminal, daemon=True)
    t.start()
    script = "stty size; echo ready; read x; stty size; echo got $x END; exit 6"
    try:
        rc = attach(vm, ["sh", "-c", script], stdin=slave, stdout=slave, stderr=slave)
        t.join(10)
        after = termios.tcgetattr(slave)
    finally:
        os.close(slave)
        os.close(master)
    text = seen.decode(errors="replace")
    assert rc == 6
    assert steps == [True], "the host terminal was not in raw mode while attached"
    assert "33 101" in text and "40 120" in text and "got go END" in text, text
    assert after == before, "the host terminal was not restored"
    assert signal.getsignal(signal.SIGWINCH) is winch_before


def test_attach_restores_the_terminal_on_failure(vm, harness):
    master, slave = os.openpty()
    try:
        before = termios.tcgetattr(slave)
        started = []

        def kill_channel():
            wait_for(lambda: started, what="attach to start")
            time.sleep(0.5)
            harness.channel.close()

        threading.Thread(target=kill_channel, daemon=True).start()

        class Out:
            def __init__(self):
                self.fd = slave

            def fileno(self):
                return slave

            def write(self, b):
                started.append(b)
                os.write(slave, b)

            def flush(self):
                pass

        with pytest.raises(CommandError, match="channel closed"):
            attach(vm, ["sh", "-c", "echo hi; sleep 100"], tty=True, stdin=slave, stdout=Out())
        assert termios.tcgetattr(slave) == before
    finally:
        os.close(slave)
        os.close(master)
