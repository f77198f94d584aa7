#!/usr/bin/env python3
"""A data plane's stand-in, capped, against the board figure it is held to (issue 30).

    sudo flock /work/notes/bench.lock .venv/bin/python bench/standin_capped.py
        [--profiles ipsec-aes128gcm,...] [--fractions 0.5,0.8,1.0,1.25,2.0] [--seconds 5]
        [--json FILE]

A pi4 node's data plane process (charon's kernel-libipsec standing in for XFRM ESP, wireguard-go
for kernel WireGuard, OpenVPN as itself) runs in groups capped at a share that
lab.model.boardkernel.plan works out so that it carries the board's figure for that data plane
(`board_mbps_predicted`: the board kernel's AEAD and packet path, or the program's own path and
cipher, per byte of the datagrams the process was calibrated with). The share assumes the
process costs the same CPU time per byte capped as uncapped (its `process_mbps`, measured by
`lab calibrate` at 200 Mbit/s without caps). Nothing else checks that. Here, per profile, one lab
on topologies/pi_pair.py (two pi4 nodes, the profile's board model as `lab up` builds it):
iperf3 UDP of 1300-byte datagrams for --seconds at each fraction of the predicted figure, the
receiver's Mbit/s against min(offered, predicted). Below 1 the stand-in should carry all it is
offered; at and above 1 it should carry the predicted figure (what it loses there, under
overload, the board loses too: work on packets dropped later). wireguard-go is left out unless
named: its figure is one of its four per-CPU groups, which together take more than one iperf3
sender on a capped node offers, so its rows read the sender. Bench output from one run on this
machine, never a test's assertion; docs/fidelity.md "Issue 30: the class IPC per routine" has a
run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lab.core.teardown import teardown  # noqa: E402
from lab.measure.base import Context, get_test  # noqa: E402
from lab.model.topology import load_topology  # noqa: E402
from lab.substrate.local.build import up  # noqa: E402

PROFILES = (
    "ipsec-aes128gcm",
    "ipsec-aes256gcm",
    "ipsec-chacha20poly1305",
    "openvpn-aes256cbc-static",
)  # wireguard-go: its figure is one of four per-CPU groups' (below)
SIZE = 1300


def udp(ctx: Context, mbit: float, seconds: float) -> dict:
    """The lab's own udp test (lab/measure/udp.py: iperf3, lost set-ups tried again), one run."""
    test = get_test("udp")
    params = test.validate({"rate_mbit": mbit, "size": SIZE, "duration_s": seconds}, source="bench")
    (rec,) = test.run(ctx, params)
    if not rec["ok"]:
        raise SystemExit(f"udp at {mbit:.1f} Mbit/s failed: {rec['error']}")
    return {"received_mbit": rec["receiver_bps"] / 1e6, "lost_pct": rec["loss_pct"]}


def run_profile(prof: str, fractions: list[float], seconds: float, n: int, raw: Path) -> dict:
    lab_id = f"sc{n}{int(time.time()) % 10000}"
    lab = up(load_topology(REPO / "topologies" / "pi_pair.py"), lab_id, vpn=prof)
    try:
        nodes = lab.status().get("nodes", {})
        dps = {
            node: (nodes.get(node, {}).get("cpu") or {}).get("dataplane") or {}
            for node in ("client", "server")
        }
        dp = dps["server"] or dps["client"]
        predicted = (dp.get("board_mbps_predicted") or 0) * 8
        if not predicted:
            return {"profile": prof, "skipped": f"no board figure here: {dp}"}
        target = lab.info["vpn"]["tunnel"]["server"]["v4"].split("/")[0]
        ctx = Context(lab.node("client"), lab.node("server"), target, raw / prof)
        rows = []
        for f in fractions:
            r = udp(ctx, f * predicted, seconds)
            r.update(fraction=f, offered_mbit=f * predicted)
            r["of_expected"] = r["received_mbit"] / min(f * predicted, predicted)
            rows.append(r)
            print(f"  {prof:26} x{f:<4} offered {f * predicted:6.1f}  received "
                  f"{r['received_mbit']:6.1f} Mbit/s  lost {r['lost_pct']:5.1f} %  "
                  f"{r['of_expected']:.2f} of expected", flush=True)  # fmt: skip
        return {
            "profile": prof,
            "predicted_mbit": predicted,
            "share": dp.get("share"),
            "groups": dp.get("groups"),
            "basis": dp.get("basis"),
            "rows": rows,
        }
    finally:
        teardown(lab_id)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--fractions", default="0.5,0.8,1.0,1.25,2.0")
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    fractions = [float(x) for x in a.fractions.split(",")]
    with tempfile.TemporaryDirectory(prefix="standin-capped-") as raw:
        out = [
            run_profile(p, fractions, a.seconds, i, Path(raw))
            for i, p in enumerate(a.profiles.split(","))
        ]
    print(
        f"\n{'profile':26} {'predicted':>9} {'share':>6} " + " ".join(f"x{f:<5}" for f in fractions)
    )
    for r in out:
        if "rows" not in r:
            print(f"{r['profile']:26} {r['skipped']}")
            continue
        cells = " ".join(f"{x['of_expected']:6.2f}" for x in r["rows"])
        print(f"{r['profile']:26} {r['predicted_mbit']:9.1f} {r['share'] or 0:6.3f} {cells}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
