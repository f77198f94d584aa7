"""One ssh session per board carrying the lab agent (BoardConnection), and the ssh command line.

A new SSH exec channel costs ~100 ms (the server's side of the session set-up), so commands do
not get one each: BoardConnection starts ONE `ssh HOST python3 ... --stdio` per board, sends the
lab agent's source (lab.substrate.vm.agentscript.agent_source()) down its stdin, and then speaks
the agent protocol over that session with lab.substrate.vm.channel.Channel, as the VM does over
virtio-serial (~1 ms a command). Nothing is installed on the board; the agent exits when the
session's stdin closes. The nodes that share a connection are lab.substrate.boards.node.

The user's ~/.ssh/config, ssh-agent and known_hosts stay in force: ssh_argv adds only batch mode
and keep-alives, and never weakens host key checking.
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from lab.core.errors import StartupError
from lab.substrate.boards.types import Board
from lab.substrate.vm.agentscript import agent_source
from lab.substrate.vm.channel import Channel, ChannelClosed

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


def log_tail(path: Path, lines: int = 10) -> str:
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
                f"{where}: ssh exited {rc} ({e.strerror}): {shlex.join(argv)}\n{log_tail(log_path)}"
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
                raise StartupError(f"{where}: {why}: {shlex.join(argv)}\n{log_tail(log_path)}")
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
