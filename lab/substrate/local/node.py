"""LocalNode: a node that is a network namespace (+ mount namespace + cgroup) on this machine.

Every process started here joins the node's cgroup before it executes (preexec), then nsenter
moves it into the node's network and mount namespaces and execs the command under the same PID.

HostNode (this_machine()): this machine itself, for the questions asked before a lab exists.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from lab.core import cgroups, proc
from lab.substrate.local import coreslots
from lab.core.arch.emulate import ArchRoot
from lab.core.node import Daemon, Node, merged_env
from lab.core.state import Ledger
from lab.substrate.local.queues import hold_queues


class LocalNode(Node):
    def __init__(
        self,
        lab_id: str,
        name: str,
        *,
        netns: str,
        mntns: Path | None,
        procs_files: list[str],
        cpu_slots: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        ledger: Ledger | None = None,
        log_dir: Path | None = None,
        arch: ArchRoot | None = None,
        dataplane: tuple[str | None, Sequence[str]] = (None, ()),
        dataplane_queue: Mapping | None = None,
    ):
        self.lab_id = lab_id
        self.name = name
        self.netns = netns
        self.mntns = mntns
        self.procs_files = list(procs_files)
        #: the node's per-core groups (lab/substrate/local/coreslots.py): a new process starts on the one with
        #: the fewest threads, and the lab's balancer spreads busy threads from there
        self.cpu_slots = list(cpu_slots)
        #: (daemon name, its groups): the process spawned under that name starts in the data
        #: plane's groups instead (lab/substrate/local/dataplane.py)
        self.dataplane = (dataplane[0], list(dataplane[1]))
        #: the board's queues its stand-in holds (lab.model.dpqueue.queue_record), or None
        self.dataplane_queue = dict(dataplane_queue) if dataplane_queue else None
        self.env = dict(env or {})
        self.ledger = ledger
        self.log_dir = log_dir
        #: a node of another architecture: its tools run from that root under qemu-user
        #: (lab.core.arch.emulate says which), with the board's CPU-feature masks over the profile's
        self.arch = arch
        if arch is not None:
            self.env.update(arch.arch.env)

    def __repr__(self) -> str:
        return f"LocalNode({self.lab_id}:{self.name})"

    # the argv prefix that enters the node; the process keeps its PID (nsenter execs, no fork)
    def wrap(self, argv: Sequence[str], cwd: str | None = None) -> list[str]:
        pre = ["nsenter", f"--net=/var/run/netns/{self.netns}"]
        if self.mntns is not None:
            pre.append(f"--mount={self.mntns}")
            # the node's /run is private: a caller's cwd under /run does not exist there
            wd = cwd if cwd and not cwd.startswith(("/run", "/var/run")) else "/"
            pre.append(f"--wd={wd}")
        return [*pre, "--", *(self.arch.wrap(argv) if self.arch else argv)]

    def _preexec(self, slots: Sequence[str] | None = None):
        files = self.procs_files
        slots = self.cpu_slots if slots is None else slots
        if slots:
            # chosen before the fork; written last, so it wins over the node group in the
            # same (cpu) hierarchy (v1), or moves the process on into the node group's threaded
            # child (v2); the child is still single-threaded then, so all its threads go
            files = [*files, cgroups.procs_file(coreslots.least_populated(list(slots)))]

        def join():
            cgroups.join(files)

        return join

    def run(self, argv, *, check=True, timeout=60, input=None, env=None):
        return proc.run(
            self.wrap(argv, os.getcwd()),
            check=check,
            timeout=timeout,
            input=input,
            env=merged_env(self.env, env),
            where=f"node {self.name}",
            preexec=self._preexec(),
        )

    def popen(self, argv, *, stdout=None, stderr=None, env=None, stdin=None):
        return proc.spawn(
            self.wrap(argv, os.getcwd()),
            stdout=stdout,
            stderr=stderr,
            stdin=stdin,
            env=merged_env(self.env, env),
            preexec=self._preexec(),
            new_session=True,
        )

    def interactive(self, argv: Sequence[str]) -> int:
        """Run attached to the caller's terminal (lab exec / lab shell); returns the exit code."""
        return subprocess.call(
            self.wrap(argv, os.getcwd()), env=merged_env(self.env, None), preexec_fn=self._preexec()
        )

    def spawn(self, name, argv, *, log=None, env=None):
        if log is None and self.log_dir is not None:
            log = self.log_dir / f"{self.name}-{name}.log"
        if self.ledger is not None:
            # intent first: if we die between fork and the PID line, the node's cgroup still
            # holds the process and teardown ends it from there
            self.ledger.record("process-intent", node=self.name, name=name)
        out = open(log, "ab") if log else subprocess.DEVNULL
        try:
            p = proc.spawn(
                self.wrap(argv),
                stdout=out,
                stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
                env=merged_env(self.env, env),
                preexec=self._preexec(
                    self.dataplane[1] if name == self.dataplane[0] and self.dataplane[1] else None
                ),
            )
        finally:
            if log:
                out.close()
        st = proc.proc_start_time(p.pid)
        if self.ledger is not None:
            self.ledger.record(
                "process",
                node=self.name,
                name=name,
                pid=p.pid,
                start_time=st,
                argv=list(argv),
                **self.ran_by(argv),
            )
        return Daemon(self.name, name, p.pid, st, log, p)

    def hold_dataplane_queues(self, daemons: list[Daemon]) -> dict | None:
        name, groups = self.dataplane
        if not self.dataplane_queue or name is None:
            return None
        return hold_queues(self, self.dataplane_queue, name, groups, daemons)

    def ran_by(self, argv: Sequence[str]) -> dict[str, str]:
        """{"arch": ...}: which architecture runs argv, for a node of another architecture
        (the ledger's process lines carry it); {} on a node of this machine's."""
        return {"arch": self.arch.ran_by(argv)} if self.arch else {}

    def missing_tools(self, tools: Sequence[str]) -> list[str]:
        """Node.missing_tools; in a node of another architecture the board's tools must be in
        its root (else they would quietly run as this machine's build)."""
        if self.arch is None:
            return super().missing_tools(tools)
        lacking = set(self.arch.missing(tools))
        on_host = [t for t in tools if not self.arch.emulates(t) and t not in lacking]
        lacking |= set(super().missing_tools(on_host))
        return [t for t in tools if t in lacking]

    def private_mounts(self) -> bool:
        """A node with a mount namespace of its own (every host node of a lab)."""
        return self.mntns is not None

    def adopt(self, name: str, pid: int, *, log: Path | None = None) -> Daemon:
        """Node.adopt, and the process goes into the ledger like a spawned one (teardown then
        stops it by PID and start time, as any daemon)."""
        d = super().adopt(name, pid, log=log)
        if self.ledger is not None and d.start_time is not None:
            self.ledger.record(
                "process", node=self.name, name=name, pid=pid, start_time=d.start_time, argv=[]
            )
        return d

    def stop(self, daemon: Daemon, *, grace: float = 3.0) -> bool:
        gone = proc.stop_pid(daemon.pid, daemon.start_time, grace=grace)
        if daemon.popen is not None:
            try:
                daemon.popen.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
        if self.ledger is not None and gone:
            self.ledger.record("process-stopped", node=self.name, name=daemon.name, pid=daemon.pid)
        return gone
