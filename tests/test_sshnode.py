"""BoardNode / BoardConnection (lab/substrate/boards/node.py, connection.py): a node on a board over one ssh session.

Three levels: the ssh command line as data; the real agent bootstrapped exactly as on a board
but started here without ssh (the "remote command" run locally, its stdio a socket pair); and a
real sshd on 127.0.0.1 with its own host key, client key and known_hosts, all in tmp_path.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import time
from pathlib import Path

import pytest

from lab.substrate.boards.connection import AGENT_COMMAND, BOOT, BoardConnection, ssh_argv
from lab.substrate.boards.node import BoardNode
from lab.substrate.boards.types import Board
from lab.core.errors import CommandError, StartupError
from lab.core.node import Daemon
from lab.core.state import Ledger

SSHD = Path("/usr/sbin/sshd")
BASE = ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=5",
        "-o", "ServerAliveCountMax=3", "-o", "ConnectTimeout=10"]  # fmt: skip


def board(**kw) -> Board:
    return Board(**{"name": "pi1", "host": "pi1.lab", "mgmt": "eth0", "data": ("eth1",), **kw})


# ---------------------------------------------------------------------- ssh argv (pure)
@pytest.mark.parametrize(
    ("fields", "options", "remote"),
    [
        ({}, [], ["true"]),
        ({"become": "sudo"}, [], ["sudo", "-n", "true"]),
        ({"port": 2222}, ["-p", "2222"], ["true"]),
        ({"user": "pi"}, ["-l", "pi"], ["true"]),
        ({"key": "/k/id"}, ["-i", "/k/id", "-o", "IdentitiesOnly=yes"], ["true"]),
        (
            {"user": "pi", "port": 22, "key": "~/.ssh/pi", "become": "sudo"},
            ["-p", "22", "-l", "pi", "-i", "~/.ssh/pi", "-o", "IdentitiesOnly=yes"],
            ["sudo", "-n", "true"],
        ),
    ],
)
def test_ssh_argv_fields(fields, options, remote):
    want = [*BASE, *options, "--", "pi1.lab", shlex.join(remote)]
    assert ssh_argv(board(**fields), ["true"]) == want


def test_ssh_argv_inventory_options_come_first_so_they_win():
    # OpenSSH keeps the first value of each option: the inventory may override our defaults
    argv = ssh_argv(board(ssh_options=("UserKnownHostsFile=/kh", "ServerAliveInterval=30")), ["x"])
    assert argv[:6] == ["ssh", "-T", "-o", "UserKnownHostsFile=/kh", "-o", "ServerAliveInterval=30"]
    assert argv[6:] == BASE[2:] + ["--", "pi1.lab", "x"]


def test_ssh_argv_quotes_the_remote_command_as_one_word_and_never_relaxes_host_keys():
    argv = ssh_argv(board(become="sudo"), AGENT_COMMAND)
    assert argv[-3:-1] == ["--", "pi1.lab"]
    assert shlex.split(argv[-1]) == ["sudo", "-n", *AGENT_COMMAND]
    assert "\n" not in BOOT  # one line: whatever login shell the board has parses it
    assert not any("StrictHostKeyChecking" in a for a in argv)


# ---------------------------------------------------------------------- the agent, no ssh
def local(_board: Board, command: list[str]) -> list[str]:
    """The "remote command" run on this machine: the agent as a board runs it, without ssh."""
    return command


@pytest.fixture
def conn(tmp_path):
    c = BoardConnection.open(board(), log_path=tmp_path / "ssh.log", command=local)
    yield c
    c.close()


def test_run_rc_stdout_stderr_input(conn):
    node = BoardNode("n1", conn)
    cp = node.run(["sh", "-c", "cat; echo err >&2; exit 3"], input="hi\n", check=False)
    assert (cp.returncode, cp.stdout, cp.stderr) == (3, "hi\n", "err\n")
    assert node.run(["true"]).returncode == 0
    assert conn.alive() and conn.ping()["kernel"] == os.uname().release


def test_run_check_raises_command_error(conn):
    node = BoardNode("n1", conn)
    with pytest.raises(CommandError) as ei:
        node.run(["sh", "-c", "echo out; echo bad >&2; exit 4"])
    e = ei.value
    assert (e.returncode, e.stdout, e.where) == (4, "out\n", "board pi1 (node n1)")
    assert "bad" in str(e)


def test_run_timeout_raises_like_proc_run(conn):
    node = BoardNode("pi1", conn)
    t = time.monotonic()
    with pytest.raises(CommandError, match="timed out after 0.3s") as ei:
        node.run(["sleep", "10"], timeout=0.3)
    assert ei.value.returncode == -1 and ei.value.where == "board pi1"
    assert time.monotonic() - t < 5


def test_run_env_is_only_the_nodes_and_the_calls(conn, monkeypatch):
    monkeypatch.setenv("LAB_CONTROLLER_ONLY", "1")
    node = BoardNode("n1", conn, env={"A": "node", "B": "node"})
    out = node.run(["env"], env={"B": None, "C": "call"}).stdout.splitlines()
    assert "A=node" in out and "C=call" in out
    assert not any(v.startswith(("B=", "LAB_CONTROLLER_ONLY=")) for v in out)


def test_spawn_outlives_the_session_and_a_new_one_stops_it(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    logs = tmp_path / "logs" / "deeper"
    c1 = BoardConnection.open(board(), log_path=tmp_path / "ssh.log", command=local)
    d = BoardNode("n1", c1, ledger=ledger, log_dir=logs).spawn(
        "echoer", ["sh", "-c", "echo started; exec sleep 60"]
    )
    assert d.log == logs / "n1-echoer.log" and d.start_time is not None
    c1.close()
    c2 = BoardConnection.open(board(), log_path=tmp_path / "ssh.log", command=local)
    try:
        node = BoardNode("n1", c2, ledger=ledger)
        assert node.is_alive(d.pid, d.start_time)
        again = Daemon("n1", "echoer", d.pid, d.start_time, d.log, where=node)
        assert again.alive()
        deadline = time.monotonic() + 5
        while "started" not in again.log_tail() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert again.log_tail() == "started"
        # a wrong start time names another process: it is not signalled
        other = Daemon("n1", "echoer", d.pid, d.start_time + 1, d.log, where=node)
        assert not other.alive()
        node.stop(other, grace=0.5)
        assert node.is_alive(d.pid, d.start_time)
        assert node.stop(again, grace=2)
        assert not node.is_alive(d.pid, d.start_time) and not again.alive()
    finally:
        c2.close()
    kinds = [(e["kind"], e.get("board")) for e in ledger.entries()]
    assert kinds[:2] == [("process-intent", "pi1"), ("process", "pi1")]
    assert kinds[-1][0] == "process-stopped"
    assert ledger.entries()[1]["argv"] == ["sh", "-c", "echo started; exec sleep 60"]


def test_spawn_of_a_missing_program_raises(conn):
    with pytest.raises(CommandError, match="no-such-prog"):
        BoardNode("n1", conn).spawn("x", ["no-such-prog"])


def test_popen_output_wait_poll_kill(conn, tmp_path):
    node = BoardNode("n1", conn)
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        p = node.popen(["sh", "-c", "echo out; echo err >&2; exit 3"], stdout=out, stderr=err)
        assert isinstance(p.pid, int) and p.pid > 0
        assert p.wait(timeout=10) == 3 and p.poll() == 3
    assert (tmp_path / "out").read_text() == "out\n"
    assert (tmp_path / "err").read_text() == "err\n"

    p = node.popen(["sleep", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert p.poll() is None and node.is_alive(p.pid, None)
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.1)
    p.kill()
    assert p.wait(timeout=5) == 128 + 9  # the shell's convention, as the agent reports it


def test_popen_is_hung_up_when_the_session_ends(tmp_path):
    c = BoardConnection.open(board(), log_path=tmp_path / "ssh.log", command=local)
    node = BoardNode("n1", c)
    p = node.popen(["sleep", "60"])
    pid = p.pid
    c.close()
    assert p.wait(timeout=10) == 255
    c2 = BoardConnection.open(board(), log_path=tmp_path / "ssh.log", command=local)
    try:
        assert not BoardNode("n1", c2).is_alive(pid, None)
    finally:
        c2.close()


def test_put_file_makes_private_parents(conn, tmp_path):
    node = BoardNode("n1", conn)
    target = tmp_path / "remote" / "a" / "secret.key"
    node.put_file(target, b"\x00key\n", mode=0o640)
    assert target.read_bytes() == b"\x00key\n"
    assert target.stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "remote" / "a").stat().st_mode & 0o777 == 0o700
    assert node.read_text(target) == "\x00key\n"


def test_sync_copies_new_and_changed_files_only(conn, tmp_path, monkeypatch):
    cfg = tmp_path / "config"
    (cfg / "sub").mkdir(parents=True)
    (cfg / "wg0.conf").write_text("one")
    (cfg / "sub" / "key").write_text("k")
    os.chmod(cfg / "sub" / "key", 0o600)
    node = BoardNode("n1", conn, sync_dirs=[cfg])
    sent: list[dict] = []

    def spy(files):
        # the "board" is this machine: writing the same path would change the file's mtime,
        # so the copy is only recorded here (test_put_file_makes_private_parents writes)
        sent.append({p: (data, mode) for p, (data, mode) in files.items()})

    monkeypatch.setattr(node, "put_files", spy)
    node.run(["true"])
    assert sent == [
        {cfg / "wg0.conf": (b"one", 0o666 & ~_umask()), cfg / "sub" / "key": (b"k", 0o600)}
    ]
    node.run(["true"])
    assert len(sent) == 1  # nothing changed: nothing sent
    (cfg / "wg0.conf").write_text("two, longer")
    node.spawn("s", ["true"])
    assert sent[1] == {cfg / "wg0.conf": (b"two, longer", 0o666 & ~_umask())}


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def test_open_fails_with_the_remote_stderr(tmp_path):
    def broken(_board, _command):
        return ["sh", "-c", "echo 'Permission denied (publickey).' >&2; exit 255"]

    with pytest.raises(StartupError, match=r"ssh exited 255(.|\n)*Permission denied"):
        BoardConnection.open(board(), log_path=tmp_path / "ssh.log", command=broken)


# ---------------------------------------------------------------------- a real sshd
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "lab-test", "-f",
                    str(path)], check=True)  # fmt: skip
    return path


class LocalSshd:
    """sshd -D on 127.0.0.1:port with a fresh host key, accepting root with a fresh client key;
    `board` reaches it checking the host key against a known_hosts file of its own."""

    def __init__(self, d: Path):
        d.mkdir(parents=True, exist_ok=True)
        self.dir = d
        self.port = free_port()
        host_key = keygen(d / "host_key")
        self.client_key = keygen(d / "client_key")
        (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
        kind, key = (d / "host_key.pub").read_text().split()[:2]
        self.known_hosts = d / "known_hosts"
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {kind} {key}\n")
        (d / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
            f"AuthorizedKeysFile {d / 'authorized_keys'}\nUsePAM no\n"
            "PermitRootLogin prohibit-password\nStrictModes no\nPidFile none\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        )
        self.made_run_dir = not Path("/run/sshd").exists()
        if self.made_run_dir:
            Path("/run/sshd").mkdir(mode=0o755)  # its privilege separation directory
        self.log = open(d / "sshd.log", "wb")
        self.proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(d / "sshd_config")],
                                     stdout=self.log, stderr=self.log)  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"sshd did not start: {(d / 'sshd.log').read_text()}")
                time.sleep(0.02)

    def board(self, **kw) -> Board:
        fields = {"name": "loop", "host": "127.0.0.1", "mgmt": "lo", "data": (), "user": "root",
                  "port": self.port, "key": str(self.client_key),
                  "ssh_options": (f"UserKnownHostsFile={self.known_hosts}",)}  # fmt: skip
        return Board(**{**fields, **kw})

    def stop(self) -> None:
        self.proc.terminate()  # by its PID: our child
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        if self.made_run_dir:
            Path("/run/sshd").rmdir()


@pytest.fixture
def sshd(tmp_path):
    if not SSHD.exists():
        pytest.skip(f"{SSHD} (openssh-server) is not installed")
    s = LocalSshd(tmp_path / "sshd")
    yield s
    s.stop()


@pytest.mark.root
def test_over_real_sshd_200_commands_and_a_daemon(sshd, tmp_path):
    c = BoardConnection.open(sshd.board(), log_path=tmp_path / "ssh.log")
    try:
        node = BoardNode("loop", c, ledger=Ledger(tmp_path / "ledger.jsonl"), log_dir=tmp_path)
        t = time.monotonic()
        rcs = [node.run(["true"]).returncode for _ in range(200)]
        took = time.monotonic() - t
        assert rcs == [0] * 200
        assert took < 10, f"200 commands took {took:.1f} s: not one session?"
        d = node.spawn("sleeper", ["sleep", "60"])
        assert d.alive() and node.is_alive(d.pid, d.start_time)
        assert node.stop(d, grace=2) and not d.alive()
    finally:
        c.close()
    assert c.ssh.returncode == 0


@pytest.mark.root
def test_real_sshd_refusals_reach_the_startup_error(sshd, tmp_path):
    stranger = keygen(tmp_path / "stranger")
    with pytest.raises(StartupError, match="Permission denied"):
        BoardConnection.open(sshd.board(key=str(stranger)), log_path=tmp_path / "a.log")
    (tmp_path / "empty_known_hosts").write_text("")
    b = sshd.board(ssh_options=(f"UserKnownHostsFile={tmp_path / 'empty_known_hosts'}",
                                "GlobalKnownHostsFile=/dev/null"))  # fmt: skip
    with pytest.raises(StartupError, match="Host key verification failed"):
        BoardConnection.open(b, log_path=tmp_path / "b.log")
