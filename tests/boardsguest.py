"""Run inside the full-kernel VM by tests/test_boards_vm.py: an emulated board farm there, a lab
on it with kernel WireGuard and kernel netem driven over SSH, and each board's state read over
the test's own SSH before and after. Prints one JSON object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.test_boards import board_state  # noqa: E402

LAB = [sys.executable, "-m", "lab.cli"]


def lab(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    cp = subprocess.run([*LAB, *args], capture_output=True, text=True, cwd=REPO, timeout=400)
    if check and cp.returncode != 0:
        raise SystemExit(json.dumps({"error": f"lab {' '.join(args)}: {cp.stderr[-2000:]}"}))
    return cp


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    inv = tmp / "farm.toml"
    topo = str(REPO / "topologies" / "pi_pair_middlebox.py")
    # boards uncapped: under TCG a Pi-4-sized share of the emulated CPU makes every SSH
    # handshake take tens of seconds, and this run proves function, not speed
    lab("boards", "emulate", topo, "-p", "cpu=host", "--out", str(inv))
    out: dict = {}
    try:
        out["before"] = board_state(inv, tmp)
        up = lab("up", topo, "--boards", str(inv), "--vpn", "wireguard", "--impair",
                 "delay 20ms loss 1%", "--id", "kb", "--json")  # fmt: skip
        st = json.loads(up.stdout)
        out["vpn_path"] = st["vpn"]["describe"].get("path")
        out["impair_backend"] = st["impair"]["backend"]
        peer = st["vpn"]["traffic"]["v4"]
        out["ping"] = lab("exec", "--id", "kb", "client", "--", "ping", "-n", "-c", "50", "-i",
                          "0.05", "-q", peer, check=False).stdout  # fmt: skip
        out["qdiscs"] = lab("exec", "--id", "kb", "router", "--", "tc", "qdisc", "show").stdout
        out["links_up"] = lab("exec", "--id", "kb", "client", "--", "ip", "-d", "link", "show",
                              "wg0").stdout  # fmt: skip
        d = lab("down", "--id", "kb", check=False)
        out["down_rc"], out["down_err"] = d.returncode, d.stderr
        out["after"] = board_state(inv, tmp)
    finally:
        lab("boards", "emulate", "--down", check=False)
    print(json.dumps(out))


if __name__ == "__main__":
    os.environ.setdefault("LAB_STATE_DIR", tempfile.mkdtemp(prefix="labstate"))
    main()
