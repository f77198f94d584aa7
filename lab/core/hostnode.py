"""This machine as a node (`HostNode`, `this_machine()`): commands in the root namespaces, probes
only. It answers "can this run here?" before any lab node exists."""

from __future__ import annotations

from lab.core import proc
from lab.core.errors import PreconditionError
from lab.core.node import Daemon, Node, merged_env


class HostNode(Node):
    """This machine itself, in its root namespaces: the node that answers "can it run here?"
    before any lab node exists (`lab profiles`, `lab render`, the VPN preflight of `lab up` and
    `lab run`). A local lab's nodes are namespaces of this machine (same kernel, same files,
    same tools), so what it answers holds for them; drivers ask it through the Node interface
    exactly as they would ask a lab node or a board. It runs probes only: it starts no daemons.
    """

    def __init__(self) -> None:
        self.name = "this machine"
        self.env: dict[str, str] = {}

    def __repr__(self) -> str:
        return "HostNode()"

    def run(self, argv, *, check=True, timeout=60, input=None, env=None):
        return proc.run(
            argv,
            check=check,
            timeout=timeout,
            input=input,
            env=merged_env(self.env, env),
            where=self.name,
        )

    def popen(self, argv, *, stdout=None, stderr=None, env=None, stdin=None):
        return proc.spawn(
            argv, stdout=stdout, stderr=stderr, stdin=stdin, env=merged_env(self.env, env)
        )

    def spawn(self, name, argv, *, log=None, env=None):
        raise PreconditionError(f"{self.name}: probes only, no daemon is started here ({name})")

    def stop(self, daemon: Daemon, *, grace: float = 3.0) -> bool:
        raise PreconditionError(f"{self.name}: probes only, it started no daemon to stop")


_this_machine: HostNode | None = None


def this_machine() -> HostNode:
    """The one HostNode of this process (probe results cached per node are shared)."""
    global _this_machine
    if _this_machine is None:
        _this_machine = HostNode()
    return _this_machine
