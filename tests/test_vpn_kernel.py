"""Kernel data planes this host lacks, proven inside ONE full-kernel VM (module-scoped): per
profile a lab up, ping v4/v6, a short iperf3, a capture on the server's wire interface (plaintext
marker absent for the encrypted ones, present for GRE/IPIP/L2TPv3), then down with nothing left;
and kernel netem's accuracy beside the userspace engine's checks.

Each profile runs as `bench/vm_dataplanes.py --guest` inside the VM (one Python process per lab:
under TCG a process start costs seconds). Skipped, naming what is missing, without QEMU or the
kernel cache (scripts/fetch-kernel.sh). On this host the same profiles are refused with "use --vm".
"""

from __future__ import annotations

import json
import sys

import pytest

from lab.core import proc
from lab.core.errors import KernelFeatureMissing
from lab.model.topology import load_topology
from lab.vpn.profiles import load_profile
from lab.vpn.tunnel import prepare
from lab.core.hostnode import this_machine
from tests.conftest import REPO, TOPOS, vm_kernel_or_skip

pytestmark = [pytest.mark.root, pytest.mark.slow]

# profile spec -> (topology, plaintext marker visible on the wire?)
PROFILES = {
    "macsec-static": ("pi_pair", False),
    "wireguard:implementation=kernel": ("pi_pair_middlebox", False),
    "ipsec-aes128gcm:dataplane=kernel,start_timeout=90": ("pi_pair_middlebox", False),
    "ipsec-aes256gcm:dataplane=kernel,start_timeout=90": ("pi_pair_middlebox", False),
    "ipsec-chacha20poly1305:dataplane=kernel,start_timeout=90": ("pi_pair_middlebox", False),
    "gre": ("pi_pair_middlebox", True),
    "ipip": ("pi_pair_middlebox", True),
    "l2tpv3": ("pi_pair_middlebox", True),
    "ip6gre": ("pi_pair_middlebox", True),
    "ip6tnl": ("pi_pair_middlebox", True),
}  # macsec-gcm-aes-128 (MKA): tests/test_vm_lab.py


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    from lab.substrate.vm import boot

    vm_kernel_or_skip()
    machine = boot(tmp_path_factory.mktemp("vmk") / "state", mem_mb=2048)
    yield machine
    machine.shutdown()
    assert not proc.is_same_process(machine.pid, machine.record["start_time"]), "QEMU still running"


def guest_json(vm, argv: list[str], timeout: float) -> dict:
    cp = vm.run([sys.executable, *argv], check=False, timeout=timeout, cwd=str(REPO))
    lines = cp.stdout.strip().splitlines()
    assert cp.returncode == 0 and lines, (
        f"exit {cp.returncode}\n{cp.stdout[-2000:]}\n{cp.stderr[-3000:]}"
    )
    return json.loads(lines[-1])


@pytest.mark.timeout(700)  # 400 s in the guest, after the VM's boot in the module's fixture
@pytest.mark.parametrize("profile", PROFILES)
def test_kernel_dataplane_in_vm(vm, profile):
    topology, plaintext = PROFILES[profile]
    r = guest_json(
        vm,
        [
            str(REPO / "bench" / "vm_dataplanes.py"),
            "--guest",
            "--topology",
            topology,
            "--id",
            "kvt",
            "--seconds",
            "1",
            profile,
        ],
        timeout=400,
    )
    assert not r.get("error"), r.get("error")
    assert r["left"] == [], r["left"]
    assert r["path"] == "kernel", r
    assert r["kernel"] == vm.kernel_release
    assert r["ping_v4_ms"] is not None and r["ping_v6_ms"] is not None
    assert r["iperf3_bytes"] > 0  # traffic passed; Mbit/s under TCG are no figure to test
    assert r["capture_bytes"] > 200  # the capture worked and carried the packets
    assert r["marker_seen"] is plaintext, (
        f"plaintext marker {'present' if r['marker_seen'] else 'absent'}"
    )
    d = r["describe"]
    assert d["mtu"]
    assert d["interface"] or d["implementation"] == "strongSwan"  # kernel XFRM: no tunnel device
    if plaintext:
        assert d["cipher"] == "none"


@pytest.mark.timeout(700)  # 400 s in the guest, after the VM's boot in the module's fixture
def test_l2tp_ipsec_in_vm(vm):
    """Study D's L2TP/IPsec (issue 20): IKEv1 + ESP transport mode carrying L2TP + PPP. Ping
    v4/v6 through ppp0, iperf3, and on the wire between the ends only ESP (no L2TP/UDP 1701,
    no PPP, the marker absent for IPv4 and IPv6 alike); the tunnel stopped leaves no XFRM
    state or policy, the lab down leaves nothing."""
    r = guest_json(
        vm,
        [
            str(REPO / "bench" / "vm_dataplanes.py"),
            "--guest",
            "--topology",
            "pi_pair_middlebox",
            "--id",
            "kli",
            "--seconds",
            "1",
            "--capture-v6",
            "--stop-vpn",
            "l2tp-ipsec",
        ],
        timeout=400,
    )
    timing = {k: r.get(k) for k in ("up_s", "ready_s", "iperf3_mbps", "vpn_down_s", "down_s")}
    print(f"l2tp-ipsec in VM ({vm.accel}): {timing} wire {r.get('capture_head')}")
    assert not r.get("error"), r.get("error")
    assert r["left"] == [] and r["vpn_left"] == [], (r["left"], r["vpn_left"])
    d = r["describe"]
    assert d["path"] == "kernel" and d["interface"] == "ppp0" and d["mtu"] == 1400, d
    assert d["ipsec"]["ike"]["version"] == "1" and d["ipsec"]["esp"]["mode"] == "TRANSPORT", d
    assert d["cipher"].startswith("AES_CBC_256") and d["auth_confirmed"] is True, d
    assert r["ping_v4_ms"] is not None and r["ping_v6_ms"] is not None
    assert r["iperf3_bytes"] > 0
    assert r["capture_bytes"] > 200 and r["capture_bytes_v6"] > 200
    assert r["marker_seen"] is False and r["marker_seen_v6"] is False
    # everything the client sent the server during the captures was ESP
    assert r["wire_protocols"] == ["ipv4 esp"], r["capture_head"]
    assert r["wire_protocols_v6"] == ["ipv4 esp"], r["capture_head"]
    assert not any(".1701" in line for line in r["capture_head"]), r["capture_head"]


@pytest.mark.timeout(900)  # 600 s in the guest, after the VM's boot in the module's fixture
def test_kernel_netem_in_vm_applies_every_case(vm):
    """Kernel netem as the lab's impairment backend (under the links' tbf), quick case set: each
    case is applied and read back from tc exactly as asked, and measured. Whether the measured
    figures fall in their accuracy bands depends on this host's speed and load (TCG): that table
    is bench/vm_netem_accuracy.py's, not a test's."""
    from bench.vm_netem_accuracy import QUICK

    r = guest_json(
        vm,
        [
            str(REPO / "bench" / "vm_netem_accuracy.py"),
            "--guest",
            "--quick",
            "--backends",
            "kernel-netem",
            "--id",
            "kvn",
        ],
        timeout=600,
    )
    assert r["backends"]["kernel-netem"]["backend"] == "kernel-netem"
    assert not r["backends"].get("left")
    assert [row["case"] for row in r["rows"]] == list(QUICK)
    for row in r["rows"]:
        assert row["kernel-netem"]["tc_differences"] == [], row


# ----------------------------------------------------------------- on this host (no VM needed)


@pytest.mark.parametrize(
    "profile",
    [
        "macsec-gcm-aes-128",
        "macsec-static",
        "gre",
        "ipip",
        "l2tpv3",
        "ip6gre",
        "ip6tnl",
        "wireguard:implementation=kernel",
        "ipsec-aes128gcm:dataplane=kernel",
        "l2tp-ipsec",
    ],
)
def test_host_without_the_module_says_use_vm(profile):
    spec = load_topology(TOPOS / "pi_pair.py", params={"cpu": None})
    drv = load_profile(profile).driver
    if drv.check(load_profile(profile).params, this_machine()).ok:
        pytest.skip("this kernel has the module: nothing to refuse")
    with pytest.raises(KernelFeatureMissing, match="--vm"):
        prepare(spec, profile)
    prepare(spec, profile, kernel=False)  # what `lab up --vm` checks on the host: all there
