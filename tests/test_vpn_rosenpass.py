"""WireGuard + Rosenpass (issue 34): the rendered rosenpass.toml beside wg0.conf, per-lab keys
(0600, never shown), the refusals before anything is built (no WireGuard on the node, rosenpass
not built, a port clash), setup.sh taking the build's packages from the driver, the handshake
test reporting the exchange; with root, the profile up on pi_pair_middlebox under pi4 caps with
real packets, rosenpass's key in both ends' wg0, a payload marker absent from the router's
capture, and nothing left after the lab goes."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import tomllib

import pytest

import lab.vpn.drivers.rosenpass as rpmod
from lab.core import proc
from lab.core.errors import ConfigError, KernelFeatureMissing, StartupError
from lab.core.proc import is_same_process
from lab.core.teardown import teardown
from lab.measure import get_test
from lab.measure.base import Context
from lab.model.topology import load_topology
from lab.substrate.local.build import up
from lab.vpn import tunnel
from lab.vpn.control import Establishment, Quiet, TunnelControl
from lab.vpn.drivers.wireguard import genkey
from lab.vpn.profiles import load_profile
from lab.vpn.tunnel import make_context, plan, redact, secret_values
from tests.conftest import REPO, TOPOS, lab_traces, router_capture, run_lab
from tests.fakenode import RecordingNode
from tests.tunnelprobe import capture_marker

PROFILE = "rosenpass"
BUILT = str(rpmod.ROSENPASS_ROOT / "bin" / "rosenpass")

needs_rosenpass = pytest.mark.skipif(
    not proc.which(BUILT),
    reason=f"needs the rosenpass binary ({BUILT}: `sudo ./setup.sh --with rosenpass` builds it)",
)


def spec_of(name: str = "pi_pair_middlebox", **params):
    return load_topology(TOPOS / f"{name}.py", params=params)


def _node(missing: str = "", kernel_wg: bool = False) -> RecordingNode:
    """A node whose `missing_tools` shell reports `missing` and whose kernel has WireGuard or
    not; every other command succeeds."""
    return RecordingNode(
        {("sh", "-c"): (0, missing, ""), ("unshare",): (0 if kernel_wg else 1, "", "no")},
        default=(0, "", ""),
    )


def _secrets(tmp_path) -> dict[str, str]:
    out = {"keys_dir": str(tmp_path / "secrets")}
    for role in ("client", "server"):
        out[f"{role}_private"], out[f"{role}_public"] = genkey()
    return out


# ------------------------------------------------------------------------- no root


def test_rendered_files_per_node(tmp_path):
    p = plan(spec_of(cpu=None), PROFILE)
    ctx = make_context("t", p, {}, tmp_path)
    secrets = _secrets(tmp_path)
    files = p.driver.render(ctx, p.profile.params, secrets)
    assert {n: set(fs) for n, fs in files.items()} == {
        "client": {"wg0.conf", "rosenpass.toml"},
        "server": {"wg0.conf", "rosenpass.toml"},
    }
    conf = {n: tomllib.loads(fs["rosenpass.toml"]) for n, fs in files.items()}
    keys = tmp_path / "secrets"
    for role, peer in (("client", "server"), ("server", "client")):
        c = conf[role]
        assert c["secret_key"] == str(keys / f"rosenpass-{role}.sk")
        assert c["public_key"] == str(keys / f"rosenpass-{role}.pk")
        assert c["listen"] == ["0.0.0.0:9999"]
        [peer_conf] = c["peers"]
        assert peer_conf["public_key"] == str(keys / f"rosenpass-{peer}.pk")
        # rosenpass hands its key to this end's wg0, for the peer's WireGuard public key
        assert (peer_conf["device"], peer_conf["peer"]) == ("wg0", secrets[f"{peer}_public"])
        # the WireGuard half is the wireguard driver's: no PresharedKey of its own
        assert "PresharedKey" not in files[role]["wg0.conf"]
        assert secrets[f"{peer}_public"] in files[role]["wg0.conf"]
    # the client initiates, at the server's underlay address; the server answers
    assert conf["client"]["peers"][0]["endpoint"] == f"{p.server.underlay_v4}:9999"
    assert "endpoint" not in conf["server"]["peers"][0]
    # shown: no key, no lab-specific path (equal profiles hash equal across labs)
    red = redact(files, secret_values(p.driver, secrets))
    for fs in red.values():
        assert str(keys) not in fs["rosenpass.toml"]
        assert "<redacted:keys_dir>/rosenpass-" in fs["rosenpass.toml"]
        assert all(secrets[k] not in t for t in fs.values() for k in secrets if "private" in k)
    over = p.driver.render(ctx, {**p.profile.params, "rosenpass_port": 7000}, secrets)
    assert tomllib.loads(over["client"]["rosenpass.toml"])["listen"] == ["0.0.0.0:7000"]


@needs_rosenpass
def test_keys_per_lab_0600_of_the_kem_sizes(tmp_path):
    p = plan(spec_of(cpu=None), PROFILE)
    ctx = make_context("t", p, {}, tmp_path)
    secrets = p.driver.secrets(ctx, p.profile.params)
    d = ctx.secrets_dir
    assert secrets["keys_dir"] == str(d) and "keys_dir" in p.driver.secret_markers
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    names = sorted(f.name for f in d.iterdir())
    assert names == sorted(
        [f"rosenpass-{r}.{x}" for r in ("client", "server") for x in ("sk", "pk")]
        + ["wg-client.key", "wg-server.key"]
    )
    for f in d.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    # Classic McEliece 460896: a 524,160-byte public key, and a new pair per lab
    assert (d / "rosenpass-client.pk").stat().st_size == 524_160
    assert (d / "rosenpass-client.pk").read_bytes() != (d / "rosenpass-server.pk").read_bytes()
    again = make_context("t2", p, {}, tmp_path / "other")
    p.driver.secrets(again, p.profile.params)
    assert (d / "rosenpass-client.sk").read_bytes() != (
        again.secrets_dir / "rosenpass-client.sk"
    ).read_bytes()


def test_no_wireguard_on_the_node_is_refused_naming_the_field():
    """implementation = "kernel" where the kernel has no WireGuard; no wireguard-go: check()
    says so, naming params.implementation, and only questions were asked."""
    prof = load_profile(f"{PROFILE}:implementation=kernel")
    a = prof.driver.check(prof.params, _node(kernel_wg=False))
    assert not a.ok and "params.implementation = 'kernel'" in a.why
    assert "kernel WireGuard unavailable" in a.why
    prof = load_profile(PROFILE)
    a = prof.driver.check(prof.params, _node(missing="wireguard-go\n"))
    assert not a.ok and "params.implementation = 'auto'" in a.why and "wireguard-go" in a.why
    spec = spec_of(cpu=None)
    nodes = {"client": _node(missing="wireguard-go\n"), "server": _node()}
    with pytest.raises(KernelFeatureMissing, match=r"rosenpass.*params\.implementation"):
        tunnel.prepare(spec, PROFILE, nodes=nodes)
    for n in nodes.values():  # RecordingNode refuses spawn outright; nothing was changed
        assert {c[0] for c in n.calls} <= {"sh", "unshare", "test", "id"}, n.calls


def test_rosenpass_not_built_names_the_setup_option():
    prof = load_profile(PROFILE)
    node = _node(missing=f"{BUILT}\nrosenpass\n", kernel_wg=True)
    a = prof.driver.check(prof.params, node)
    assert not a.ok and "setup.sh --with rosenpass" in a.why and BUILT in a.why
    assert prof.driver.check(prof.params, _node(kernel_wg=True)).ok


def test_a_rosenpass_profile_without_wireguard_here_is_refused_before_anything_is_built(
    tmp_path, lab_id
):
    """Kernel WireGuard asked for on a machine whose kernel has none."""
    impl = "kernel"
    prof = load_profile(PROFILE)
    if tunnel.check_on(
        prof.driver, {**prof.params, "implementation": impl}, {"n": tunnel.this_machine()}
    ).ok:
        pytest.skip("this machine's kernel has WireGuard (the case needs one without)")
    f = tmp_path / "pq.toml"
    f.write_text(f'driver = "rosenpass"\n[params]\nimplementation = "{impl}"\n')
    r = run_lab("up", TOPOS / "pi_pair_middlebox.py", "--id", lab_id, "--vpn", f)
    assert r.returncode != 0
    assert f"params.implementation = '{impl}'" in r.stderr, r.stderr
    assert "no WireGuard for rosenpass to feed" in r.stderr
    assert lab_traces(lab_id) == []


def test_port_clash_and_bad_values_name_file_and_field(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('driver = "rosenpass"\n[params]\nrosenpass_port = 51820\n')
    with pytest.raises(ConfigError) as e:
        load_profile(str(f))
    assert f"{f}: params.rosenpass_port" in str(e.value) and "listen_port" in str(e.value)
    # boringtun 0.7.1 cannot modify a running peer: rosenpass's `wg set` would hang it
    f.write_text('driver = "rosenpass"\n[params]\nimplementation = "boringtun"\n')
    with pytest.raises(ConfigError) as e:
        load_profile(str(f))
    assert f"{f}: params.implementation" in str(e.value)
    assert "accepted: 'auto', 'kernel', 'wireguard-go'" in str(e.value)
    f.write_text('driver = "rosenpass"\n[params]\nimplementation = "wolfguard"\n')
    with pytest.raises(ConfigError) as e:
        load_profile(str(f))
    assert "params.implementation" in str(e.value) and "'boringtun'" in str(e.value)


def test_setup_sh_builds_it_with_the_drivers_build_packages():
    text = (REPO / "setup.sh").read_text()
    assert "from lab.vpn.drivers.rosenpass import BUILD_PACKAGES" in text
    # not listed by hand anywhere in setup.sh
    code = "\n".join(line.split("#")[0] for line in text.splitlines())
    for pkg in ("libclang-dev", "libsodium-dev", "cmake"):
        assert not re.search(rf"(?<![\w-]){re.escape(pkg)}(?![\w-])", code), pkg
    assert re.search(r'cargo install --locked --quiet rosenpass .*--root "\$root"', text)
    bad = subprocess.run(
        ["bash", str(REPO / "setup.sh"), "--with", "wolfguard"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "accepted: boringtun, rosenpass" in bad.stderr
    # the binary's one library is a declared runtime package (packages.txt, generated)
    assert "libsodium23  # driver rosenpass" in (REPO / "packages.txt").read_text()


def test_start_waits_for_the_same_key_on_both_ends(tmp_path):
    """psk_of reads `wg show wg0 preshared-keys`; _wait_psk gives up naming the end without a
    key, or saying the keys differ (then WireGuard's handshake could not complete)."""
    p = plan(spec_of(cpu=None), PROFILE)

    def node(psk: str) -> RecordingNode:
        return RecordingNode({("wg", "show"): (0, f"PEERKEY=\t{psk}\n", "")})

    def ctx_with(client: str, server: str):
        return make_context("t", p, {"client": node(client), "server": node(server)}, tmp_path)

    drv = p.driver
    assert rpmod.psk_of(node("(none)")) is None and rpmod.psk_of(node("K=")) == "K="
    with pytest.raises(StartupError, match=r"rosenpass: no key on server within 0.05 s"):
        drv._wait_psk(ctx_with("K=", "(none)"), 0.05)
    with pytest.raises(StartupError, match=r"the ends' keys differ within 0.05 s"):
        drv._wait_psk(ctx_with("K=", "L="), 0.05)
    assert drv._wait_psk(ctx_with("K=", "K="), 0.05) > 0


class _Tunnel:
    name = "fake"

    def __init__(self, est: Establishment):
        self.est = est

    def quiesce(self, *, timeout: float) -> Quiet:
        return Quiet(True, 0.0)

    def establish(self, *, cap_s: float, probe_s: float) -> Establishment:
        return self.est


def test_handshake_reports_the_key_exchange_when_the_driver_has_one(tmp_path):
    hs = get_test("handshake")
    params = hs.validate({}, source="t")
    ctx = Context(None, None, "10.99.0.2", tmp_path / "raw", tunnel=None)
    ex = {"what": "rosenpass", "ms": 61.0, "bytes": 2900, "packets": 4}
    ctx.tunnel = _Tunnel(Establishment(True, ms=80.0, exchange=ex))
    [rec] = hs.run(ctx, params)
    assert (rec["key_exchange_ms"], rec["key_exchange_bytes"], rec["key_exchange_packets"]) == (
        61.0,
        2900,
        4,
    )
    assert rec["handshake_ms"] == 80.0 and rec["key_exchange"] == "rosenpass"
    ctx.tunnel = _Tunnel(Establishment(True, ms=80.0))
    [rec] = hs.run(ctx, params)
    assert not any(k.startswith("key_exchange") for k in rec)
    assert {m.name for m in hs.metrics} >= {
        "key_exchange_ms",
        "key_exchange_bytes",
        "key_exchange_packets",
    }


def test_key_exchange_reads_what_start_measured(tmp_path):
    drv = load_profile(PROFILE).driver
    ctx = make_context("t", plan(spec_of(cpu=None), PROFILE), {}, tmp_path)
    assert drv.key_exchange(ctx, {}) is None
    ctx.log_dir.mkdir()
    (ctx.log_dir / rpmod.EXCHANGE_FILE).write_text('{"what": "x", "ms": 1, "bytes": 2}')
    assert drv.key_exchange(ctx, {})["bytes"] == 2
    # other drivers have none
    assert load_profile("wireguard").driver.key_exchange(ctx, {}) is None


# ------------------------------------------------------------------------- root


@pytest.mark.root
@needs_rosenpass
@pytest.mark.skipif(
    not all(proc.which(t) for t in ("tcpdump", "wg", "wireguard-go")),
    reason="needs tcpdump, wg and wireguard-go (./setup.sh)",
)
def test_profile_up_under_pi4_caps(lab_id):
    spec = spec_of()  # the topology's default: cpu = "pi4"
    assert spec.nodes["client"].cpu == "pi4" and spec.nodes["server"].cpu == "pi4"
    lab = up(spec, lab_id, vpn=PROFILE)
    v = lab.info["vpn"]
    daemons = [(d["pid"], d["start_time"], d["name"]) for d in v["daemons"]]
    try:
        assert sorted(n for *_, n in daemons).count("rosenpass") == 2
        client, server = lab.node("client"), lab.node("server")
        d = v["describe"]
        assert d["implementation"].endswith("+ Rosenpass") and d["interface"] == "wg0"
        assert d["rosenpass_version"].startswith("rosenpass") and d["mtu"] == 1420
        assert "Classic McEliece" in d["key_exchange"]
        for n in ("client", "server"):
            cpu = lab.runtime[n].cpu
            assert cpu["profile"] == "pi4", cpu
        # rosenpass's key is in both ends' wg0, the same one, for the peer
        keys = [rpmod.psk_of(node) for node in (client, server)]
        assert keys[0] and keys[0] == keys[1]
        # WireGuard's only handshake so far used it: one happened, and it is the PSK one
        # (a tunnel whose ends held different keys would pass nothing below)
        for fam, addr in ((4, "10.99.0.2"), (6, "fd99::2")):
            route = json.loads(client.run(["ip", f"-{fam}", "-j", "route", "get", addr]).stdout)
            assert route[0]["dev"] == "wg0"
            client.run(["ping", f"-{fam}", "-c", "2", "-i", "0.2", "-W", "2", addr])
        seen, size = capture_marker(lab, "10.99.0.2")
        assert size > 200 and not seen, "plaintext marker on the router's wire"
        record = (lab.dir / "lab.json").read_text()
        assert keys[0] not in record

        # the handshake test's cold establishment, the router capturing the client's side: the
        # exchange the driver reports is the one on the wire, and it precedes WireGuard's
        # first handshake (which therefore already mixes in the post-quantum key)
        pcap = lab.dir / "test-restart.pcap"
        with router_capture(lab, pcap):
            est = TunnelControl(lab, load_profile(PROFILE)).establish(cap_s=20, probe_s=0.005)
        assert est.ok, est.error
        frames = [
            (float(f[0]), int(re.search(r"length (\d+):", line).group(1)), line)
            for line in lab.node("router")
            .run(["tcpdump", "-r", str(pcap), "-n", "-e", "-tt", "udp"])
            .stdout.splitlines()
            if (f := line.split())
        ]
        rp = [(t, n) for t, n, line in frames if ".9999 > " in line]
        wg = [t for t, n, line in frames if ".51820 > " in line]
        assert len(rp) >= 4 and wg and max(t for t, _ in rp[:4]) < min(wg), frames
        ex = est.exchange
        assert ex["packets"] >= len(rp) and ex["bytes"] >= sum(n for _, n in rp)
        # what else the ends sent meanwhile: ARP at most (the neighbour cache may be cold)
        assert ex["bytes"] - sum(n for _, n in rp) <= 2 * 42 * 2, (ex, rp)
        assert keys[0] != rpmod.psk_of(client) == rpmod.psk_of(server)  # a new key
        for f in (lab.dir / "secrets").iterdir():
            assert f.stat().st_mode & 0o777 == 0o600, f
    finally:
        assert teardown(lab_id) == []
    assert lab_traces(lab_id) == []
    for pid, start_time, name in daemons:
        assert not is_same_process(pid, start_time), f"{name} {pid} survived"
