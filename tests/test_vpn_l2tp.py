"""L2TPv2 + PPP (xl2tpd + pppd), driver `l2tp`: rendering, secrets, validation, the host's
refusal, and the real thing inside ONE full-kernel VM (module-scoped): lab up on
pi_pair_middlebox, ping v4/v6, a short iperf3, a capture on the router showing the plaintext
marker inside L2TP (UDP 1701), the tunnel stopped with the lab kept (no xl2tpd/pppd, ppp
interface, /etc/ppp mount or /run file left), then the lab down with nothing left.

The in-VM part is this file run as a script (`python tests/test_vpn_l2tp.py --guest ...`: one
Python process, under TCG a process start costs seconds); it reuses bench/vm_dataplanes.py's
iperf3, capture and wire-point helpers.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

from tests import goldens  # noqa: E402
from lab.core.errors import ConfigError, KernelFeatureMissing  # noqa: E402
from lab.model.topology import load_topology  # noqa: E402
from lab.vpn.drivers import l2tp  # noqa: E402
from lab.vpn.profiles import load_profile  # noqa: E402
from lab.vpn.tunnel import (  # noqa: E402
    make_context,
    plan,
    prepare,
    redact,
    render,
    secret_values,
)
from lab.core.hostnode import this_machine  # noqa: E402
from tests.fakenode import RecordingNode  # noqa: E402


def spec_of(name: str):
    return load_topology(ROOT / "topologies" / f"{name}.py", params={"cpu": None})


# ------------------------------------------------------------------------- rendering


def test_render_per_node_files_and_roles():
    res = render(spec_of("pi_pair_middlebox"), "l2tp")
    files = res["files"]
    assert set(files) == {"client", "server"}
    for fs in files.values():
        assert set(fs) == {"xl2tpd.conf", "ppp/options", "ppp/options.xl2tpd", "ppp/chap-secrets"}
    c, s = files["client"], files["server"]
    # the LAC dials the LNS's underlay address; the LNS admits only the LAC's
    assert "[lac lab]" in c["xl2tpd.conf"] and "lns = 10.0.2.2" in c["xl2tpd.conf"]
    assert "listen-addr = 10.0.1.2" in c["xl2tpd.conf"] and "autodial = yes" in c["xl2tpd.conf"]
    assert "[lns lab]" in s["xl2tpd.conf"] and "lac = 10.0.1.2" in s["xl2tpd.conf"]
    # PPP hands out the tunnel planner's addresses: client .1, server .2
    assert "local ip = 10.99.0.2" in s["xl2tpd.conf"]
    assert "ip range = 10.99.0.1-10.99.0.1" in s["xl2tpd.conf"]
    for conf in (c["xl2tpd.conf"], s["xl2tpd.conf"]):
        assert "port = 1701" in conf and "pppoptfile = /etc/ppp/options.xl2tpd" in conf
        assert "force userspace" not in conf
    # CHAP: the LNS requires it, the LAC authenticates with it and requires nothing itself
    assert "require chap = yes" in s["xl2tpd.conf"]
    sopts, copts = s["ppp/options.xl2tpd"].splitlines(), c["ppp/options.xl2tpd"].splitlines()
    assert {"auth", "require-chap", "name lab-lns"} <= set(sopts)
    assert {"noauth", "refuse-pap", "name lab-lac", "remotename lab-lns"} <= set(copts)
    for opts in (sopts, copts):
        # Debian's /etc/ppp/options defaults overridden explicitly; compression off
        assert {"mtu 1400", "mru 1400", "noccp", "novj", "unit 0"} <= set(opts)
        assert {"lcp-echo-interval 30", "lcp-echo-failure 4", "+ipv6", "logfd 2"} <= set(opts)
    assert "ipv6 ::1,::2" in copts and "ipv6 ::2,::1" in sopts
    line = '"lab-lac" "lab-lns" "<redacted:chap_secret>" 10.99.0.1'
    assert line in c["ppp/chap-secrets"] and line in s["ppp/chap-secrets"]


def test_render_params_change_the_files():
    spec = spec_of("pi_pair_middlebox")
    files = render(
        spec, "l2tp:dataplane=userspace,mtu=1280,ipv6=false,compression=deflate,port=1702"
    )["files"]
    c, s = files["client"], files["server"]
    assert "force userspace = yes" in c["xl2tpd.conf"] and "port = 1702" in s["xl2tpd.conf"]
    opts = set(c["ppp/options.xl2tpd"].splitlines())
    assert {"mtu 1280", "noipv6", "deflate 15", "nobsdcomp"} <= opts
    assert "noccp" not in opts and "+ipv6" not in opts


def test_render_site_to_site_addresses():
    files = render(spec_of("site_to_site"), "l2tp")["files"]
    p = plan(spec_of("site_to_site"), "l2tp")
    srv = files[p.server.node]["xl2tpd.conf"]
    assert f"lac = {p.client.underlay_v4}" in srv and f"listen-addr = {p.server.underlay_v4}" in srv


@pytest.mark.parametrize("profile", goldens.FAMILIES["l2tp"].profiles)
def test_golden_configs_pi_pair_middlebox(profile):
    """tests/data/vpn/l2tp/; after an intended change run scripts/regen-goldens.py."""
    got = goldens.rendered("l2tp", profile)
    assert got and got == goldens.stored("l2tp", profile)


def test_secrets_are_0600_in_0700_dir_and_redacted(tmp_path):
    p = plan(spec_of("pi_pair_middlebox"), "l2tp")
    ctx = make_context("t", p, {}, tmp_path)
    secrets = p.driver.secrets(ctx, p.profile.params)
    assert stat.S_IMODE(ctx.secrets_dir.stat().st_mode) == 0o700
    files = list(ctx.secrets_dir.iterdir())
    assert [f.name for f in files] == ["l2tp-chap-secret"]
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert files[0].read_text().strip() == secrets["chap_secret"]
    assert re.fullmatch(r"[0-9a-f]{32}", secrets["chap_secret"])
    # fresh per lab
    assert p.driver.secrets(ctx, p.profile.params)["chap_secret"] != secrets["chap_secret"]
    rendered = p.driver.render(ctx, p.profile.params, secrets)
    assert secrets["chap_secret"] in rendered["server"]["ppp/chap-secrets"]
    red = redact(rendered, secret_values(p.driver, secrets))
    for fs in red.values():
        for text in fs.values():
            assert secrets["chap_secret"] not in text
    # the files as deployed hold the secret: written 0600
    written = ctx.write_config(ctx.server, rendered["server"])
    for path in written.values():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


@pytest.mark.parametrize(
    "override, field, words",
    [
        ("dataplane=ppp", "params.dataplane", ["kernel", "userspace"]),
        ("compression=lzs", "params.compression", ["none", "deflate", "bsdcomp"]),
        ("mtu=99999", "params.mtu", ["576", "1500"]),
        ("port=0", "params.port", ["1", "65535"]),
        ("ipv6=maybe", "params.ipv6", ["bool"]),
        ("cipher=aes", "params.cipher", ["dataplane", "mtu", "port"]),
    ],
)
def test_bad_override_names_field_and_choices(override, field, words):
    with pytest.raises(ConfigError) as e:
        load_profile(f"l2tp:{override}")
    msg = str(e.value)
    assert field in msg and "--vpn" in msg, msg
    for w in words:
        assert w in msg, (w, msg)


def test_bad_profile_file_names_file_field_and_choices(tmp_path):
    f = tmp_path / "bad-l2tp.toml"
    f.write_text('driver = "l2tp"\n[params]\ncompression = "mppc"\n')
    with pytest.raises(ConfigError) as e:
        load_profile(str(f))
    msg = str(e.value)
    assert (
        str(f) in msg
        and "params.compression" in msg
        and "one of 'none', 'deflate', 'bsdcomp'" in msg
    )


# ------------------------------------------------------------------------- the host


def _kernel(config: str) -> RecordingNode:
    """A node whose /proc/config.gz holds `config`."""
    return RecordingNode({("gzip", "-dc", "/proc/config.gz"): (0, config, "")})


def test_check_names_the_missing_kernel_features():
    a = l2tp.L2TPDriver().check(load_profile("l2tp").params, _kernel("CONFIG_PPP=m\n"))
    assert not a.ok and a.path == "kernel"
    assert "L2TP (CONFIG_PPPOL2TP, module l2tp_ppp)" in a.why and "PPP (" not in a.why
    assert "--vm" in a.why
    # the userspace data plane needs PPP only
    userspace = load_profile("l2tp:dataplane=userspace").params
    assert l2tp.L2TPDriver().check(userspace, _kernel("CONFIG_PPP=m\n")).ok
    a = l2tp.L2TPDriver().check(userspace, _kernel("# CONFIG_PPP is not set\n"))
    assert not a.ok and "PPP (CONFIG_PPP, module ppp_generic)" in a.why


def test_check_without_a_kernel_config_asks_the_node_for_its_modules():
    """Debian's kernels (the lab VM's) do not expose /proc/config.gz: the node's modules.dep
    says what can load."""
    node = RecordingNode(
        {
            ("uname", "-r"): (0, "6.1.0-x\n", ""),
            ("cat", "/lib/modules/6.1.0-x/modules.dep"): (
                0,
                "kernel/drivers/net/ppp/ppp_generic.ko: kernel/lib/crc-ccitt.ko\n"
                "kernel/net/l2tp/l2tp_ppp.ko: kernel/net/l2tp/l2tp_core.ko\n",
                "",
            ),
        }
    )
    assert l2tp.L2TPDriver().check(load_profile("l2tp").params, node).ok
    assert ["gzip", "-dc", "/proc/config.gz"] in node.calls and ["ls", "-1", "/sys/module"] in (
        node.calls
    )


@pytest.mark.parametrize("profile", ["l2tp", "l2tp:dataplane=userspace"])
def test_host_without_ppp_or_l2tp_refuses_and_says_use_vm(profile):
    prof = load_profile(profile)
    avail = prof.driver.check(prof.params, this_machine())
    if avail.ok:
        pytest.skip("this kernel has PPP and L2TP: nothing to refuse")
    spec = spec_of("pi_pair_middlebox")
    with pytest.raises(KernelFeatureMissing, match="--vm") as e:
        prepare(spec, profile)
    assert "PPP" in str(e.value)
    prepare(spec, profile, kernel=False)  # what `lab up --vm` checks on the host: all there


# ------------------------------------------------------------------------- in the VM


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    from lab.core import proc
    from lab.substrate.vm import boot
    from tests.conftest import vm_kernel_or_skip

    vm_kernel_or_skip()
    machine = boot(tmp_path_factory.mktemp("vml2tp") / "state", mem_mb=2048)
    yield machine
    machine.shutdown()
    assert not proc.is_same_process(machine.pid, machine.record["start_time"]), "QEMU still running"


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("profile", ["l2tp"])
@pytest.mark.timeout(700)  # 400 s in the guest, after the VM's boot in the module's fixture
def test_l2tp_in_vm(vm, profile):
    cp = vm.run(
        [sys.executable, str(Path(__file__).resolve()), "--guest", "--id", "kl2tp", profile],
        check=False,
        timeout=400,
        cwd=str(ROOT),
    )
    lines = cp.stdout.strip().splitlines()
    assert cp.returncode == 0 and lines, f"exit {cp.returncode}\n{cp.stdout[-2000:]}\n{cp.stderr}"
    r = json.loads(lines[-1])
    timing = {k: r.get(k) for k in ("up_s", "ready_s", "iperf3_mbps", "vpn_down_s", "down_s")}
    print(f"l2tp in VM ({vm.accel}): {timing}")  # pytest -s: the figures for docs/l2tp.md
    assert not r.get("error"), r
    d = r["describe"]
    assert d["path"] == "kernel" and d["implementation"] == "xl2tpd + pppd", d
    assert d["cipher"] == "none" and d["interface"] == "ppp0" and d["mtu"] == 1400
    assert d["auth_confirmed"] is True and d["compression_negotiated"] is None
    assert r["kernel"] == vm.kernel_release
    assert r["ping_v4_ms"] is not None and r["ping_v6_ms"] is not None
    assert set(r["ppp_addrs"]["client"]) >= {"10.99.0.1", "fd99::1", "fe80::1"}
    assert set(r["ppp_addrs"]["server"]) >= {"10.99.0.2", "fd99::2", "fe80::2"}
    assert r["pppd"] == {"client": 1, "server": 1}  # one pppd per end, started by xl2tpd
    assert r["iperf3_bytes"] > 0  # traffic passed; Mbit/s under TCG are no figure to test
    assert r["capture_bytes"] > 200
    assert r["marker_seen"] is True  # no encryption: the marker is on the wire
    assert r["l2tp_udp_1701"] is True, r["capture_head"]
    assert r["after_vpn_down"] == [], r["after_vpn_down"]  # driver.stop: nothing of it left
    assert r["left"] == [], r["left"]  # lab down: nothing left


# ------------------------------------------------------------------------- guest side


def _node_leftovers(lab, node: str, pids: list[int]) -> list[str]:
    """ppp links, the /etc/ppp mount, /run files and processes of the tunnel left in `node`."""
    from lab.core import proc

    # one process in the node (under TCG each costs seconds): links, mounts, files
    script = "ip -o link show type ppp; grep -c ' /etc/ppp ' /proc/self/mountinfo; ls -A /run"
    out = lab.node(node).run(["sh", "-c", script], check=False).stdout.splitlines()
    left = [f"{node}: link {ln.split(':')[1].strip()}" for ln in out if ": ppp" in ln]
    mounts = [ln for ln in out if ln.strip().isdigit()]
    if mounts and int(mounts[0]):
        left.append(f"{node}: mount /etc/ppp")
    ours = {Path(f).name for f in l2tp.RUN_FILES}
    left += [f"{node}: file /run/{ln}" for ln in out if ln.strip() in ours]
    for pid in pids:
        if Path(f"/proc/{pid}").exists():
            left.append(f"{node}: process {pid} ({proc.run(['cat', f'/proc/{pid}/comm']).stdout})")
    return left


def guest(profile: str, lab_id: str, seconds: float) -> dict:
    from bench.vm_dataplanes import _capture, _iperf3, _rtt, wire_point
    from lab.substrate.local.build import up
    from lab.core.teardown import teardown
    from lab.vpn.teardown import tear_down

    res: dict = {"profile": profile, "kernel": os.uname().release}
    spec = spec_of("pi_pair_middlebox")
    t0 = time.monotonic()
    try:
        lab = up(spec, lab_id, vpn=profile)
        res["up_s"] = round(time.monotonic() - t0, 2)
        v = lab.info["vpn"]
        res["describe"] = v["describe"]
        res["ready_s"] = v["timing"]["ready_s"]
        client, server = lab.node("client"), lab.node("server")
        res["ppp_addrs"] = {}
        for name in ("client", "server"):
            out = lab.node(name).run(["ip", "-j", "addr", "show", "dev", "ppp0"]).stdout
            res["ppp_addrs"][name] = sorted(
                a["local"] for a in json.loads(out)[0].get("addr_info", [])
            )
        pids = {name: [] for name in ("client", "server")}
        for d in v["daemons"]:
            pids[d["node"]].append(d["pid"])
        res["pppd"] = {
            name: sum(1 for d in v["daemons"] if d["node"] == name and d["name"] == "pppd")
            for name in ("client", "server")
        }
        for fam in ("v4", "v6"):
            cp = client.run(
                ["ping", "-n", "-c", "3", "-i", "0.2", "-W", "3", v["traffic"][fam]], check=False
            )
            res[f"ping_{fam}_ms"] = _rtt(cp.stdout) if cp.returncode == 0 else None
        got = _iperf3(client, server, v["traffic"]["v4"], seconds)
        res["iperf3_mbps"] = round(got["bits_per_second"] / 1e6, 1)
        res["iperf3_bytes"] = got["bytes"]
        node, ifname = wire_point(lab)
        seen, size, shown = _capture(lab, node, ifname, v["traffic"]["v4"])
        res.update(marker_seen=seen, capture_bytes=size, capture_head=shown.splitlines()[:10])
        res["l2tp_udp_1701"] = bool(re.search(r"\.1701 > [\d.]+\.1701: .*l2tp", shown, re.I))
        t1 = time.monotonic()
        tear_down(lab)  # the tunnel only: the driver's stop(), the lab stays
        res["vpn_down_s"] = round(time.monotonic() - t1, 2)
        res["after_vpn_down"] = [
            x for name in ("client", "server") for x in _node_leftovers(lab, name, pids[name])
        ]
    except Exception as e:  # reported, then the lab is still taken down
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        t2 = time.monotonic()
        res["left"] = teardown(lab_id)
        res["down_s"] = round(time.monotonic() - t2, 2)
    return res


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("profiles", nargs="+")
    ap.add_argument("--guest", action="store_true", required=True)
    ap.add_argument("--id", default="kl2tp")
    ap.add_argument("--seconds", type=float, default=2)
    a = ap.parse_args()
    for prof in a.profiles:
        print(json.dumps(guest(prof, a.id, a.seconds)), flush=True)
