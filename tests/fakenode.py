"""A Node that runs nothing: it answers commands from a table and records every argv.

For unit tests of code that must ask a node (Driver.check, kernelfeatures, Node helpers) and
must not touch the machine the tests run on.

    node = RecordingNode({("gzip", "-dc", "/proc/config.gz"): (0, "CONFIG_PPP=m\\n", "")})
    drv.check(params, node); node.calls  # [["gzip", "-dc", "/proc/config.gz"], ...]

Keys are argv prefixes (the longest matching one answers) and values (exit code, stdout,
stderr) or a function of argv (and input) returning one; anything else gets `default`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping

from lab.core.errors import CommandError
from lab.core.node import Node

Answer = tuple[int, str, str]


class RecordingNode(Node):
    def __init__(
        self,
        answers: Mapping[tuple[str, ...], Answer | Callable[..., Answer]] | None = None,
        *,
        name: str = "fake",
        default: Answer = (1, "", "fake node: no answer"),
    ):
        self.name = name
        self.env: dict[str, str] = {}
        self.answers = dict(answers or {})
        self.default = default
        self.calls: list[list[str]] = []
        self.inputs: list[str | None] = []

    def answer(self, argv: list[str], input: str | None = None) -> Answer:
        for key in sorted(self.answers, key=len, reverse=True):
            if tuple(argv[: len(key)]) == tuple(key):
                a = self.answers[key]
                if callable(a):
                    return a(argv, input) if a.__code__.co_argcount > 1 else a(argv)
                return a
        return self.default

    def run(self, argv, *, check=True, timeout=60, input=None, env=None):
        argv = [str(a) for a in argv]
        self.calls.append(argv)
        self.inputs.append(input)
        rc, out, err = self.answer(argv, input)
        if check and rc != 0:
            raise CommandError(argv, rc, err, where=f"node {self.name}")
        return subprocess.CompletedProcess(argv, rc, out, err)

    def spawn(self, name, argv, *, log=None, env=None):
        raise AssertionError(f"{self.name}: nothing may be started here ({argv})")

    def stop(self, daemon, *, grace=3.0):
        raise AssertionError(f"{self.name}: nothing was started here")

    def popen(self, argv, *, stdout=None, stderr=None, env=None):
        raise AssertionError(f"{self.name}: nothing may be started here ({argv})")

    def commands(self) -> list[str]:
        """argv[0] of every command run, in order."""
        return [c[0] for c in self.calls]
