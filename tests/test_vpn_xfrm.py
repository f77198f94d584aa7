"""IPsec transport mode with manual keys (driver xfrm-manual, study C).

Without root: rendering (golden files with SPIs masked), keys 0600 and redacted, fresh keys and
SPIs per lab, bad parameters, the refusal of topologies whose traffic endpoints are not the VPN
endpoints, and this host's refusal (no AH/ESP) with "use --vm".

In ONE full-kernel VM (module-scoped; skipped naming QEMU or the kernel cache when missing):
each profile on pi_pair_middlebox, and AH+ESP on host_router_router_host, through
bench/vm_dataplanes.py --guest: lab up, ping v4 and v6, a short iperf3, the marker captured on
the wire (AH: visible and the packets are AH, IP protocol 51; ESP: invisible), then the tunnel
stopped with no XFRM state or policy left, then the lab down with nothing left.
"""

from __future__ import annotations

import re
import stat
import sys

import pytest

from tests import goldens
from lab.core import proc
from lab.core.errors import ConfigError, KernelFeatureMissing
from lab.model.topology import load_topology
from lab.vpn import get_driver
from lab.vpn.profiles import load_profile
from lab.vpn.tunnel import make_context, plan, prepare, redact, render, secret_values
from lab.core.hostnode import this_machine
from lab.vpn.xfrmsa import overhead, sa_names
from tests.conftest import REPO, TOPOS, vm_kernel_or_skip

PROFILES = ("ipsec-transport-ah", "ipsec-transport-esp", "ipsec-transport-ah-esp")


def spec_of(name: str):
    return load_topology(TOPOS / f"{name}.py", params={"cpu": None})


def _mask_spis(text: str) -> str:
    return re.sub(r"spi 0x[0-9a-f]{8}", "spi <spi>", text)


# ------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("profile", goldens.FAMILIES["xfrm"].profiles)
def test_golden_configs_pi_pair_middlebox(profile):
    """tests/data/vpn/<profile>/; after an intended change run scripts/regen-goldens.py."""
    got = goldens.rendered("xfrm", profile)
    assert got and got == goldens.stored("xfrm", profile)


@pytest.mark.parametrize(
    "profile, protos, states",
    [
        ("ipsec-transport-ah", {"ah"}, 4),
        ("ipsec-transport-esp", {"esp"}, 4),
        ("ipsec-transport-ah-esp", {"ah", "esp"}, 8),
    ],
)
def test_render_states_policies_and_algorithms(profile, protos, states):
    res = render(spec_of("pi_pair"), profile)
    up = res["files"]["client"]["xfrm.ip"]
    adds = [ln for ln in up.splitlines() if ln.startswith("xfrm state add")]
    assert len(adds) == states
    assert {re.search(r"proto (\w+)", ln)[1] for ln in adds} == protos
    assert all("mode transport" in ln for ln in adds)
    # both families, both directions, between the underlay addresses (no tunnel addresses)
    for pair in ("src 10.0.1.1 dst 10.0.1.2", "src 10.0.1.2 dst 10.0.1.1"):
        assert any(pair in ln for ln in adds)
    for pair in ("src fd00:1::1 dst fd00:1::2", "src fd00:1::2 dst fd00:1::1"):
        assert any(pair in ln for ln in adds)
    assert "10.99.0." not in up and "fd99::" not in up
    for ln in adds:
        if "proto ah" in ln:
            assert re.search(r"auth-trunc hmac\(sha1\) <redacted:[\w-]+> 96$", ln), ln
            assert " enc " not in ln
        else:  # study C's ESP: 3DES-CBC, no authenticator
            assert re.search(r"enc cbc\(des3_ede\) <redacted:[\w-]+>$", ln), ln
            assert "auth" not in ln
    pols = [ln for ln in up.splitlines() if ln.startswith("xfrm policy add")]
    protect = [ln for ln in pols if "tmpl" in ln]
    assert len(protect) == 4  # out + in, v4 + v6
    if protos == {"ah", "esp"}:  # ESP innermost, AH outside: IP | AH | ESP | payload
        assert all(ln.index("proto esp") < ln.index("proto ah") for ln in protect)
    # IPv6 neighbour discovery between the two addresses bypasses IPsec, with precedence
    bypass = [ln for ln in pols if "tmpl" not in ln]
    assert len(bypass) == 4 and all("proto 58 type 13" in ln for ln in bypass)
    # the down script removes exactly what the up script adds
    down = res["files"]["client"]["xfrm-down.ip"]
    dels = [ln for ln in down.splitlines() if ln.startswith("xfrm ")]
    assert len(dels) == len(adds) + len(pols)
    for ln in adds:
        src_dst_spi = re.search(r"(src \S+ dst \S+ proto \w+ spi \S+)", ln)[1]
        assert f"xfrm state delete {src_dst_spi}" in dels
    for ln in pols:
        sel = re.sub(r" priority \d+.*$", "", ln).replace("policy add", "policy delete")
        assert sel in dels


def test_esp_auth_and_other_algorithms():
    res = render(
        spec_of("pi_pair"),
        "ipsec-transport-esp:esp_auth=true,enc=cbc(aes),auth=hmac(sha256)",
        show_secrets=True,
    )
    up = res["files"]["server"]["xfrm.ip"]
    (ln, *_) = [ln for ln in up.splitlines() if ln.startswith("xfrm state add")]
    assert re.search(
        r"auth-trunc hmac\(sha256\) 0x[0-9a-f]{64} 128 enc cbc\(aes\) 0x[0-9a-f]{32}$", ln
    )


def test_overhead():
    assert overhead(load_profile("ipsec-transport-ah").params) == 24  # 12 header + 12 ICV
    assert overhead(load_profile("ipsec-transport-esp").params) == 8 + 8 + 7 + 2
    assert overhead(load_profile("ipsec-transport-ah-esp").params) == 24 + 25


# ------------------------------------------------------------------------- secrets


@pytest.mark.parametrize("profile", PROFILES)
def test_keys_0600_fresh_per_lab_and_redacted(profile, tmp_path):
    p = plan(spec_of("pi_pair_middlebox"), profile)
    drv, params = p.driver, p.profile.params
    one = make_context("a", p, {}, tmp_path / "a")
    two = make_context("b", p, {}, tmp_path / "b")
    s1, s2 = drv.secrets(one, params), drv.secrets(two, params)
    assert stat.S_IMODE(one.secrets_dir.stat().st_mode) == 0o700
    (f,) = one.secrets_dir.iterdir()
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    n = len(sa_names(params["protocol"]))
    spis = [v for k, v in s1.items() if k.endswith("-spi")]
    assert len(spis) == len(set(spis)) == n and all(int(s, 16) >= 0x100 for s in spis)
    keys = secret_values(drv, s1)
    assert len(keys) == n  # one key per SA (no ESP authenticator in the study's profiles)
    assert not set(s1.values()) & set(s2.values())  # fresh keys and SPIs per lab
    for k, v in keys.items():
        want = 20 if k.endswith("-auth") else 24  # HMAC-SHA1 160 bits, 3DES 192 bits
        assert re.fullmatch(rf"0x[0-9a-f]{{{2 * want}}}", v), k
    rendered = drv.render(one, params, s1)
    red = redact(rendered, keys)
    for fs in red.values():
        for text in fs.values():
            for value in keys.values():
                assert value not in text
    assert red["client"]["xfrm.ip"].count("<redacted:") == n
    for spi in spis:  # SPIs are not secret: they stay (the down script needs them)
        assert spi in red["client"]["xfrm-down.ip"]


def test_config_hash_does_not_depend_on_keys_or_spis(tmp_path):
    from lab.vpn.xfrmsa import secret_layout

    p = plan(spec_of("pi_pair_middlebox"), "ipsec-transport-ah-esp")
    drv, params = p.driver, p.profile.params
    ctx = make_context("a", p, {}, tmp_path)
    a, b = drv.secrets(ctx, params), drv.secrets(ctx, params)
    ph = {k: f"<{k}>" for k, _ in secret_layout(params)}
    assert set(ph) == set(a)
    assert drv.render(ctx, params, a) != drv.render(ctx, params, b)
    assert "0x" not in "".join(drv.render(ctx, params, ph)["client"].values())


# ------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "spec, field, words",
    [
        ("ipsec-transport-ah:protocol=gre", "params.protocol", "one of 'ah', 'esp', 'ah+esp'"),
        ("ipsec-transport-ah:auth=hmac(sha999)", "params.auth", "hmac(sha1)"),
        ("ipsec-transport-esp:enc=cbc(des)", "params.enc", "one of 'cbc(des3_ede)', 'cbc(aes)'"),
        ("ipsec-transport-ah:esp_auth=true", "params.esp_auth", "esp, ah+esp"),
        (
            "ipsec-transport-esp:replay_window=64",
            "params.replay_window",
            "accepted: int >= 0 and <= 32",
        ),
    ],
)
def test_bad_override_names_field_and_choices(spec, field, words):
    with pytest.raises(ConfigError) as e:
        load_profile(spec)
    msg = str(e.value)
    assert msg.startswith("--vpn") and field in msg and words in msg, msg


def test_bad_profile_file_names_the_file(tmp_path):
    f = tmp_path / "x.toml"
    f.write_text('driver = "xfrm-manual"\n[params]\nprotocol = "ipcomp"\n')
    with pytest.raises(ConfigError) as e:
        load_profile(str(f))
    msg = str(e.value)
    assert str(f) in msg and "params.protocol" in msg and "one of 'ah', 'esp', 'ah+esp'" in msg


@pytest.mark.parametrize("topology", ["site_to_site", "router_under_test"])
def test_refused_where_traffic_endpoints_are_not_the_vpn_endpoints(topology):
    spec = spec_of(topology)
    with pytest.raises(ConfigError) as e:
        prepare(spec, "ipsec-transport-ah-esp", kernel=False)
    msg = str(e.value)
    assert str(TOPOS / f"{topology}.py") in msg and repr(topology) in msg
    assert "transport mode" in msg and "pi_pair" in msg
    with pytest.raises(ConfigError, match="transport mode cannot protect the networks behind"):
        render(spec, "ipsec-transport-ah")  # `lab render` refuses too


@pytest.mark.parametrize("topology", ["pi_pair", "pi_pair_middlebox", "host_router_router_host"])
def test_accepted_where_the_endpoints_talk_to_each_other(topology):
    spec = spec_of(topology)
    p = prepare(spec, "ipsec-transport-esp", kernel=False)
    assert p.traffic_target(spec)["v4"] == p.server.underlay_v4  # no tunnel address
    assert not get_driver("xfrm-manual").has_tunnel


# ------------------------------------------------------------------------- this host


@pytest.mark.parametrize("profile", PROFILES)
def test_host_without_ah_esp_refuses_and_says_use_vm(profile):
    prof = load_profile(profile)
    avail = prof.driver.check(prof.params, this_machine())
    if avail.ok:
        pytest.skip("this kernel has AH/ESP and the algorithms: nothing to refuse")
    assert avail.path == "kernel"
    need = {"ah": ["ah4", "ah6"], "esp": ["esp4", "esp6"]}
    for proto in prof.params["protocol"].split("+"):
        # name the missing module(s) of this protocol, whichever this kernel lacks
        assert any(m in avail.why for m in need[proto]) or "des3_ede" in avail.why, avail.why
    with pytest.raises(KernelFeatureMissing, match="--vm") as e:
        prepare(spec_of("pi_pair"), profile)
    assert profile in str(e.value)
    prepare(spec_of("pi_pair"), profile, kernel=False)  # what `lab up --vm` checks on the host


def test_check_names_what_this_host_lacks():
    """On this CI host (no CONFIG_INET_AH/ESP, no DES): exactly those are named."""
    from lab.vpn.kernelfeatures import kernel_facts

    config = kernel_facts(this_machine()).config
    if config is None or config.get("CONFIG_INET_AH") in ("y", "m"):
        pytest.skip("not the CI host's kernel (its config is not readable or it has AH)")
    why = (
        load_profile("ipsec-transport-ah")
        .driver.check(load_profile("ipsec-transport-ah").params, this_machine())
        .why
    )
    assert "ah4 (CONFIG_INET_AH)" in why and "ah6 (CONFIG_INET6_AH)" in why
    prof = load_profile("ipsec-transport-esp")
    why = prof.driver.check(prof.params, this_machine()).why
    assert "esp4 (CONFIG_INET_ESP)" in why and "esp6 (CONFIG_INET6_ESP)" in why
    if config.get("CONFIG_CRYPTO_DES") not in ("y", "m"):
        assert "des3_ede (CONFIG_CRYPTO_DES)" in why


# ------------------------------------------------------------------------- in the VM

# (topology, profiles): one guest process per topology (a process start costs seconds in TCG)
VM_RUNS = {
    "pi_pair_middlebox": PROFILES,
    "host_router_router_host": ("ipsec-transport-ah-esp",),
}
#: outer IP protocol chain of the marker datagrams on the wire, per protocol
CHAINS = {"ah": "ah,udp", "esp": "esp", "ah+esp": "ah,esp"}


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    from lab.substrate.vm import boot

    vm_kernel_or_skip()
    machine = boot(tmp_path_factory.mktemp("vmx") / "state", mem_mb=2048)
    yield machine
    machine.shutdown()
    assert not proc.is_same_process(machine.pid, machine.record["start_time"]), "QEMU still running"


def guest_rows(vm, topology: str, profiles, timeout: float) -> list[dict]:
    import json

    argv = [
        sys.executable,
        str(REPO / "bench" / "vm_dataplanes.py"),
        "--guest",
        "--topology",
        topology,
        "--id",
        "kvx",
        "--seconds",
        "1",
        "--capture-v6",
        "--stop-vpn",
        *profiles,
    ]
    cp = vm.run(argv, check=False, timeout=timeout, cwd=str(REPO))
    lines = cp.stdout.strip().splitlines()
    assert cp.returncode == 0 and len(lines) == len(profiles), (
        f"exit {cp.returncode}\n{cp.stdout[-3000:]}\n{cp.stderr[-3000:]}"
    )
    return [json.loads(ln) for ln in lines]


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("topology", VM_RUNS)
@pytest.mark.timeout(600)  # 300 s in the guest, after the VM's boot in the module's fixture
def test_transport_mode_in_vm(vm, topology):
    rows = guest_rows(vm, topology, VM_RUNS[topology], timeout=300)
    for r in rows:
        prof = load_profile(r["profile"])
        protocol = prof.params["protocol"]
        where = f"{r['profile']} on {topology}"
        assert not r.get("error"), (where, r.get("error"))
        assert r["left"] == [], (where, r["left"])
        assert r["vpn_left"] == [], (where, r["vpn_left"])  # no XFRM state/policy after stop
        assert r["path"] == "kernel" and r["kernel"] == vm.kernel_release, where
        assert r["ping_v4_ms"] is not None and r["ping_v6_ms"] is not None, where
        assert r["iperf3_bytes"] > 0, where  # traffic passed (the rate: bench/vm_dataplanes.py)
        d = r["describe"]
        assert d["mode"] == "transport" and d["protocol"] == protocol
        # every SA of the client, both directions and families, counted traffic: the pings
        # and iperf3 were protected
        sas = d["sas_client"]
        assert len(sas) == len(sa_names(protocol)), (where, sas)
        assert all(sa["bytes"] for sa in sas), (where, sas)
        # the wire: AH authenticates but does not encrypt (marker visible, IP protocol 51);
        # ESP (alone or inside AH) hides it
        plaintext = protocol == "ah"
        assert r["capture_bytes"] > 200 and r["capture_bytes_v6"] > 200, where
        assert r["marker_seen"] is plaintext, (where, "v4", r["capture_protocols"])
        assert r["marker_seen_v6"] is plaintext, (where, "v6", r["capture_protocols_v6"])
        assert r["capture_protocols"] == [f"ipv4 {CHAINS[protocol]}"], (where, r)
        assert r["capture_protocols_v6"] == [f"ipv6 {CHAINS[protocol]}"], (where, r)
        print(
            f"{where}: up {r['up_s']} s, ready {r['ready_s']} s, ping {r['ping_v4_ms']}/"
            f"{r['ping_v6_ms']} ms, iperf3 {r['iperf3_mbps']} Mbit/s (TCG), "
            f"wire {r['capture_protocols']} {r['capture_protocols_v6']}, down {r['down_s']} s"
        )
