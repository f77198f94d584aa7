#!/usr/bin/env python3
"""Wall time of one `true` on a board: over the lab agent's one ssh session (BoardNode.run) vs a
fresh exec channel per command through an OpenSSH ControlMaster vs a new ssh connection each.

    sudo .venv/bin/python bench/board_ssh.py [--n 200] [--n-ssh 30]

The "board" is a local sshd on 127.0.0.1 with its own keys (the one tests/test_sshnode.py
starts), so the figures are the protocol's cost without a network; the ratios are measured in
the same run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lab.substrate.boards.connection import BoardConnection, ssh_argv
from lab.substrate.boards.node import BoardNode
from tests.test_sshnode import SSHD, LocalSshd


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def summary(name: str, xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    med, p90 = statistics.median(xs), xs[min(len(xs) - 1, int(0.9 * len(xs)))]
    print(f"{name:<34} median {med * 1000:8.2f} ms   p90 {p90 * 1000:8.2f} ms   (n={len(xs)})")
    return med, p90


def ssh_true(argv: list[str]) -> None:
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200, help="commands over the agent session")
    ap.add_argument("--n-ssh", type=int, default=30, help="ssh invocations per ssh variant")
    a = ap.parse_args()
    if not SSHD.exists():
        sys.exit(f"{SSHD} (openssh-server) is not installed")
    with tempfile.TemporaryDirectory(prefix="lab-board-bench-") as d:
        d = Path(d)
        sshd = LocalSshd(d / "sshd")
        try:
            board = sshd.board()
            t = time.perf_counter()
            conn = BoardConnection.open(board, log_path=d / "ssh.log")
            t_open = time.perf_counter() - t
            try:
                node = BoardNode(board.name, conn)
                node.run(["true"])  # warm-up
                agent = summary(
                    "agent session (BoardNode.run)", timed(lambda: node.run(["true"]), a.n)
                )
            finally:
                conn.close()
            print(f"{'  (session set-up, once)':<34} {t_open * 1000:8.1f} ms")

            mux = replace(board, ssh_options=(*board.ssh_options, "ControlMaster=auto",
                                              f"ControlPath={d}/cm-%C", "ControlPersist=60"))  # fmt: skip
            mux_argv = ssh_argv(mux, ["true"])
            ssh_true(mux_argv)  # starts the master
            try:
                muxed = summary(
                    "ssh exec channel via ControlMaster", timed(lambda: ssh_true(mux_argv), a.n_ssh)
                )
            finally:
                stop = ssh_argv(mux, [])
                stop[1:1] = ["-O", "exit"]
                subprocess.run(stop[:-1], capture_output=True, stdin=subprocess.DEVNULL)
            plain_argv = ssh_argv(board, ["true"])
            plain = summary(
                "ssh, new connection each", timed(lambda: ssh_true(plain_argv), a.n_ssh)
            )
        finally:
            sshd.stop()
    print(f"ratio ControlMaster / agent: {muxed[0] / agent[0]:.0f}x (median), "
          f"{muxed[1] / agent[1]:.0f}x (p90)")  # fmt: skip
    print(f"ratio new connection / agent: {plain[0] / agent[0]:.0f}x (median), "
          f"{plain[1] / agent[1]:.0f}x (p90)")  # fmt: skip


if __name__ == "__main__":
    main()
