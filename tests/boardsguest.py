"""Run inside the full-kernel VM by tests/test_boards_vm.py: an emulated board farm there, a lab
on it with kernel WireGuard and kernel netem driven over SSH, and each board's state read over
the test's own SSH before and after. Prints one JSON object.

The readings while the lab is up (ping through the tunnel, qdiscs, the tunnel link) go over the
test's own SSH too, one connection per board in this process: under TCG every `lab` command is
a Python start-up of 6-12 s, and `lab exec` on boards is tested on the local farm
(tests/test_boards.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.test_boards import board_state  # noqa: E402

LAB = [sys.executable, "-m", "lab.cli.main"]
#: seconds each step took (printed with the result: where the test's time goes under TCG)
SECONDS: dict[str, float] = {}


def timed(step: str, f, *args, **kw):
    t0 = time.monotonic()
    try:
        return f(*args, **kw)
    finally:
        SECONDS[step] = round(SECONDS.get(step, 0) + time.monotonic() - t0, 2)


def lab(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    step = "lab " + " ".join(a for a in args[:5] if not a.startswith("/"))
    cp = timed(step, subprocess.run, [*LAB, *args], capture_output=True, text=True, cwd=REPO,
               timeout=400)  # fmt: skip
    if check and cp.returncode != 0:
        raise SystemExit(json.dumps({"error": f"lab {' '.join(args)}: {cp.stderr[-2000:]}"}))
    return cp


def readings(inv_path: Path, tmp: Path, peer: str) -> dict[str, str]:
    """Ping through the tunnel and the tunnel link on the client board, the qdiscs on the
    router board, over a connection of this test's own to each."""
    from lab.substrate.boards.inventory import load_inventory
    from lab.substrate.boards.connection import BoardConnection
    from lab.substrate.boards.node import BoardNode

    boards = load_inventory(inv_path).boards
    conns = {}
    try:
        for name in ("client", "router"):
            conns[name] = BoardConnection.open(boards[name], log_path=tmp / f"r-{name}.log")
        client, router = (BoardNode(n, conns[n]) for n in ("client", "router"))
        ping = ["ping", "-n", "-c", "50", "-i", "0.05", "-q", peer]
        return {
            "ping": client.run(ping, check=False, timeout=120).stdout,
            "links_up": client.run(["ip", "-d", "link", "show", "wg0"], check=False).stdout,
            "qdiscs": router.run(["tc", "qdisc", "show"], check=False).stdout,
        }
    finally:
        for conn in conns.values():
            conn.close()


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    inv = tmp / "farm.toml"
    topo = str(REPO / "topologies" / "pi_pair_middlebox.py")
    # boards uncapped: under TCG a Pi-4-sized share of the emulated CPU makes every SSH
    # handshake take tens of seconds, and this run proves function, not speed
    lab("boards", "emulate", topo, "-p", "cpu=host", "--out", str(inv))
    out: dict = {}
    try:
        out["before"] = timed("board_state before", board_state, inv, tmp)
        up = lab("up", topo, "--boards", str(inv), "--vpn", "wireguard", "--impair",
                 "delay 20ms loss 1%", "--id", "kb", "--json")  # fmt: skip
        st = json.loads(up.stdout)
        out["vpn_path"] = st["vpn"]["describe"].get("path")
        out["impair_backend"] = st["impair"]["backend"]
        peer = st["vpn"]["traffic"]["v4"]
        out.update(timed("readings", readings, inv, tmp, peer))
        d = lab("down", "--id", "kb", check=False)
        out["down_rc"], out["down_err"] = d.returncode, d.stderr
        out["after"] = timed("board_state after", board_state, inv, tmp)
    finally:
        lab("boards", "emulate", "--down", check=False)
    out["seconds"] = SECONDS
    print(json.dumps(out))


if __name__ == "__main__":
    os.environ.setdefault("LAB_STATE_DIR", tempfile.mkdtemp(prefix="labstate"))
    main()
