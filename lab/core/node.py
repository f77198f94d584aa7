"""Running commands on a node: the one small interface everything above the build layer uses.

A node is where commands run: today a network namespace on this machine (LocalNode); later a
Raspberry Pi over SSH or a namespace inside a full-kernel VM. Code outside lab/build and
lab/substrate/local/lab.py must use only this interface, never assume a local namespace.
"""

from __future__ import annotations

import os
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lab.core import proc


@dataclass
class Daemon:
    """A background process the lab started in a node (recorded in the ledger by PID)."""

    node: str
    name: str
    pid: int
    start_time: int | None
    log: Path | None
    popen: subprocess.Popen | None = field(default=None, repr=False)
    #: the node the process runs on when that is not this machine (a board): alive() and
    #: log_tail() then ask it, through the Node interface; None: this machine's /proc and files
    where: Node | None = field(default=None, repr=False, compare=False)

    def alive(self) -> bool:
        if self.popen is not None and self.popen.poll() is not None:
            return False
        if self.where is not None:
            cp = self.where.run(["cat", f"/proc/{self.pid}/stat"], check=False, timeout=30)
            st = proc.parse_start_time(cp.stdout) if cp.returncode == 0 else None
            return st is not None and (self.start_time is None or st == self.start_time)
        return proc.is_same_process(self.pid, self.start_time)

    def log_text(self) -> str:
        """The whole log ("" when there is none yet), read where the process runs: drivers
        wait for a daemon's log line with this, never by opening the file themselves."""
        if self.log and self.where is not None:
            cp = self.where.run(["cat", str(self.log)], check=False, timeout=30)
            return cp.stdout if cp.returncode == 0 else ""
        if not self.log or not self.log.exists():
            return ""
        return self.log.read_text(errors="replace")

    def log_tail(self, lines: int = 30) -> str:
        if self.log and self.where is not None:
            cp = self.where.run(["tail", "-n", str(lines), str(self.log)], check=False, timeout=30)
            return cp.stdout.rstrip("\n") if cp.returncode == 0 else ""
        if not self.log or not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class Node(ABC):
    """Run commands on one node of a lab."""

    name: str
    #: environment every process started on this node gets (e.g. the CPU profile's crypto masks)
    env: dict[str, str]
    #: the board kernel's queues its data plane's stand-in holds (lab.model.dpqueue.queue_record),
    #: None where there is none to hold (no board profile, or a kind of node that is the board)
    dataplane_queue: dict | None = None

    @abstractmethod
    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout: float | None = 60,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        """Run argv on the node to completion and capture its output (text)."""

    @abstractmethod
    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Daemon:
        """Start argv in the background on the node; its PID is recorded before this returns."""

    @abstractmethod
    def stop(self, daemon: Daemon, *, grace: float = 3.0) -> bool:
        """Stop a daemon this lab started (SIGTERM, wait, SIGKILL, reap). True if gone."""

    @abstractmethod
    def popen(
        self, argv: Sequence[str], *, stdout=None, stderr=None, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen:
        """Start argv on the node attached to the caller (foreground helpers, e.g. tcpdump)."""

    # ------------------------------------------------------------------ asked on the node
    # Questions about the node are answered by commands the node runs (self.run), never by
    # reading the controller's files: the same code works for a namespace here, a VM guest or a
    # board over SSH. A kind of node may override one with something cheaper that gives the
    # same answer.

    def missing_tools(self, tools: Sequence[str]) -> list[str]:
        """Of `tools` (names looked up on PATH plus the sbin directories, or absolute paths),
        those this node cannot execute, in their order."""
        if not tools:
            return []
        script = (
            'PATH="$PATH:/usr/sbin:/sbin:/usr/local/sbin"; '
            'for t; do command -v "$t" >/dev/null 2>&1 || echo "$t"; done'
        )
        cp = self.run(["sh", "-c", script, "sh", *tools], check=False, timeout=30)
        if cp.returncode != 0:  # no shell at all: nothing can be said to be there
            return list(tools)
        gone = set(cp.stdout.split())
        return [t for t in tools if t in gone]

    def private_mounts(self) -> bool:
        """True when a mount made by a command on this node is seen by this node's processes
        only (a mount namespace of its own), so a driver may bind its files over a fixed path
        (pppd's /etc/ppp) without changing the machine. False unless a kind of node knows."""
        return False

    def hold_dataplane_queues(self, daemons: list[Daemon]) -> dict | None:
        """Size the queues of the process standing in for the board's kernel data plane (its UDP
        sockets, the node's TUN devices) to the board's (lab.model.dpqueue), once the tunnel's
        daemons run; returns what was set, None where nothing is to be held (no stand-in, no
        board profile, or a kind of node that is the board itself)."""
        return None

    def children(self, pid: int) -> list[int]:
        """PIDs of the children of process `pid` on this node (empty when it has none or is
        gone)."""
        cp = self.run(["cat", f"/proc/{pid}/task/{pid}/children"], check=False)
        return [int(x) for x in cp.stdout.split()] if cp.returncode == 0 else []

    def adopt(self, name: str, pid: int, *, log: Path | None = None) -> Daemon:
        """A process on this node that the lab did not spawn itself but owns (e.g. the pppd an
        xl2tpd of ours started), as a Daemon: its PID and start time, read on the node."""
        cp = self.run(["cat", f"/proc/{pid}/stat"], check=False)
        start = proc.parse_start_time(cp.stdout) if cp.returncode == 0 else None
        return Daemon(self.name, name, pid, start, log)


def merged_env(
    base: Mapping[str, str | None], *extra: Mapping[str, str | None] | None
) -> dict[str, str]:
    """The caller's environment updated with `base` then `extra`; a None value removes the
    variable (a CPU profile's MASK_VARS that it does not set)."""
    env = dict(os.environ)
    for e in (base, *extra):
        for k, v in (e or {}).items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
    return env
