"""tinc 1.0 (and study B's OpenVPN static-key variants): rendered configs, keys, validation,
golden files, and with root the data plane really on UDP, a missing legacy provider caught, and
site-to-site routing through tinc0. Ping/iperf3/confidentiality/MTU/teardown per profile are in
tests/test_vpn_integration.py (PROFILES)."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import pytest

from tests import goldens
from lab.core import proc
from lab.core.errors import ConfigError, StartupError
from lab.substrate.local.build import up
from lab.core.teardown import teardown
from lab.model.topology import load_topology
from lab.vpn.profiles import load_profile
from lab.vpn.drivers.tinc import CIPHERS, TincDriver
from lab.vpn.teardown import tear_down
from lab.vpn.tunnel import make_context, plan, redact, render, secret_values
from tests.conftest import TOPOS, captured, lab_traces, router_capture

REPO = Path(__file__).resolve().parent.parent
TINC = ("tinc", "tinc-nocipher", "tinc-nodigest", "tinc-none")
OPENVPN_B = ("openvpn-bf-sha1-static", "openvpn-nocipher-static", "openvpn-nodigest-static")

needs_tinc = pytest.mark.skipif(
    not all(proc.which(t) for t in ("tincd", "openssl")), reason="needs tincd and openssl"
)


def spec_of(name: str):
    return load_topology(TOPOS / f"{name}.py", params={"cpu": None})


# ------------------------------------------------------------------------- no root


@needs_tinc
@pytest.mark.parametrize("profile", goldens.FAMILIES["tinc"].profiles)
def test_golden_configs_pi_pair_middlebox(profile):
    """tests/data/vpn/<profile>/; after an intended change run scripts/regen-goldens.py."""
    got = goldens.rendered("tinc", profile)
    assert got and got == goldens.stored("tinc", profile)


@needs_tinc
def test_rendered_tinc_configs():
    p = plan(spec_of("pi_pair_middlebox"), "tinc")
    files = render(spec_of("pi_pair_middlebox"), "tinc")["files"]
    c, s = files["client"], files["server"]
    assert (
        set(c)
        == set(s)
        == {
            "tinc.conf",
            "hosts/client",
            "hosts/server",
            "rsa_key.priv",
            "tinc-up",
            "openssl.cnf",
        }
    )
    # the hosts files are the public halves, the same on both ends
    assert c["hosts/client"] == s["hosts/client"] and c["hosts/server"] == s["hosts/server"]
    conf = {n: dict(_kv(fs["tinc.conf"])) for n, fs in files.items()}
    assert conf["client"]["ConnectTo"] == "server" and "ConnectTo" not in conf["server"]
    for n in ("client", "server"):
        assert conf[n]["Name"] == n and conf[n]["Mode"] == "router"
        assert conf[n]["Interface"] == "tinc0" and conf[n]["PMTUDiscovery"] == "no"
    srv = _kv(s["hosts/server"])
    assert ("Address", p.server.underlay_v4) in srv and ("Port", "655") in srv
    assert ("Cipher", "blowfish") in srv and ("Digest", "sha1") in srv
    assert [v for k, v in srv if k == "Subnet"] == ["10.99.0.2/32", "fd99::2/128"]
    assert "Address" not in dict(_kv(c["hosts/client"]))  # the server never connects out
    assert "-----BEGIN RSA PUBLIC KEY-----" in c["hosts/server"]
    assert c["rsa_key.priv"] == "<redacted:client_private>\n"
    assert s["rsa_key.priv"] == "<redacted:server_private>\n"
    assert "ip -4 addr add 10.99.0.1/24" in c["tinc-up"]
    assert "ip -6 addr add fd99::2/64" in s["tinc-up"] and "mtu 1500" in s["tinc-up"]
    assert "legacy = legacy_sect" in c["openssl.cnf"]
    # no Blowfish, no legacy provider file
    none = render(spec_of("pi_pair_middlebox"), "tinc-none")["files"]["client"]
    assert "openssl.cnf" not in none
    assert ("Cipher", "none") in _kv(none["hosts/client"])
    assert "MACLength" not in none["hosts/client"]


def _kv(text: str) -> list[tuple[str, str]]:
    out = []
    for line in text.splitlines():
        if line.startswith("-----BEGIN"):
            break
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out.append((k.strip(), v.strip()))
    return out


@needs_tinc
def test_site_to_site_subnets_and_routes():
    p = plan(spec_of("site_to_site"), "tinc")
    files = render(spec_of("site_to_site"), "tinc")["files"]
    c, s = files[p.client.node], files[p.server.node]
    # each node owns its tunnel address and the networks behind it ...
    subnets = [v for k, v in _kv(c[f"hosts/{p.server.node}"]) if k == "Subnet"]
    assert subnets == ["10.99.0.2/32", "fd99::2/128", *p.server.behind] and p.server.behind
    # ... and its tinc-up routes the networks behind the peer into the tunnel
    for net in p.server.behind:
        assert f'route replace {net} dev "$INTERFACE"' in c["tinc-up"]
    for net in p.client.behind:
        assert f'route replace {net} dev "$INTERFACE"' in s["tinc-up"]


@needs_tinc
def test_keys_are_2048_bit_rsa_pairs_0600_and_redacted(tmp_path):
    p = plan(spec_of("pi_pair_middlebox"), "tinc")
    ctx = make_context("t", p, {}, tmp_path)
    secrets = p.driver.secrets(ctx, p.profile.params)
    assert stat.S_IMODE(ctx.secrets_dir.stat().st_mode) == 0o700
    files = sorted(f.name for f in ctx.secrets_dir.iterdir())
    assert files == ["tinc-client.priv", "tinc-server.priv"]
    for f in ctx.secrets_dir.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    rendered = p.driver.render(ctx, p.profile.params, secrets)
    for role in ("client", "server"):
        priv = ctx.secrets_dir / f"tinc-{role}.priv"
        text = proc.run(["openssl", "rsa", "-in", priv, "-noout", "-text"]).stdout
        assert "Private-Key: (2048 bit" in text
        pub = proc.run(["openssl", "rsa", "-in", priv, "-RSAPublicKey_out"]).stdout.strip()
        # the public key in both nodes' hosts/<role> is this private key's
        for node in rendered.values():
            assert pub in node[f"hosts/{role}"]
    assert secrets["client_private"] != secrets["server_private"]
    red = redact(rendered, secret_values(p.driver, secrets))
    for fs in red.values():
        for text in fs.values():
            assert "PRIVATE KEY" not in text


@pytest.mark.parametrize(
    "body, field, words",
    [
        ('cipher = "aes-999-xyz"', "params.cipher", CIPHERS),
        ('digest = "sha3"', "params.digest", ("sha1", "sha256", "none")),
        ("port = 0", "params.port", ("accepted: int >= 1 and <= 65535",)),
        ('pmtu_discovery = "yes"', "params.pmtu_discovery", ("bool",)),
    ],
)
def test_bad_params_name_file_field_and_choices(tmp_path, body, field, words):
    f = tmp_path / "bad.toml"
    f.write_text(f'driver = "tinc"\n[params]\n{body}\n')
    with pytest.raises(ConfigError) as e:
        load_profile(str(f))
    msg = str(e.value)
    assert str(f) in msg and field in msg
    for w in words:
        assert w in msg


def test_override_on_command_line_is_checked():
    with pytest.raises(ConfigError, match=r"--vpn: params.cipher: .*blowfish"):
        load_profile("tinc:cipher=twofish")
    assert load_profile("tinc:pmtu_discovery=yes").params["pmtu_discovery"] is True


def test_study_b_openvpn_profiles():
    got = {n: load_profile(n).params for n in OPENVPN_B}
    assert {n: (p["mode"], p["cipher"], p["auth"], p["proto"]) for n, p in got.items()} == {
        "openvpn-bf-sha1-static": ("static", "BF-CBC", "SHA1", "udp"),
        "openvpn-nocipher-static": ("static", "none", "SHA1", "udp"),
        "openvpn-nodigest-static": ("static", "BF-CBC", "none", "udp"),
    }
    conf = render(spec_of("pi_pair_middlebox"), "openvpn-bf-sha1-static")["files"]["client"]
    assert "providers legacy default" in conf["openvpn.conf"]


# ------------------------------------------------------------------------- root


@pytest.mark.root
@needs_tinc
@pytest.mark.skipif(not proc.which("tcpdump"), reason="needs tcpdump")
def test_data_plane_is_udp_not_the_tcp_meta_connection(lab_id):
    """tinc falls back to its TCP meta connection when it has no packet key: the packets must
    cross the router as UDP to port 655, each one about the inner size plus tinc's overhead."""
    lab = up(spec_of("pi_pair_middlebox"), lab_id, vpn="tinc")
    try:
        pcap = lab.dir / "test-capture.pcap"
        with router_capture(lab, pcap):
            lab.node("client").run(
                ["ping", "-c", "20", "-i", "0.01", "-s", "1000", "-W", "2", "10.99.0.2"]
            )
        # 20 requests + 20 replies, 1028 B of IP each, in tinc's UDP packets
        assert captured(lab, pcap, "udp port 655 and greater 1050") >= 40
        assert captured(lab, pcap, "tcp port 655 and greater 1000") == 0
        d = lab.info["vpn"]["describe"]
        assert (d["transport"], d["cipher"], d["openssl_legacy_provider"]) == (
            "udp",
            "blowfish",
            True,
        )
    finally:
        assert teardown(lab_id) == []
    assert lab_traces(lab_id) == []


@pytest.mark.root
@needs_tinc
def test_blowfish_without_legacy_provider_is_a_startup_error(lab_id, monkeypatch):
    """Without openssl.cnf tincd cannot set up its Blowfish packet key under OpenSSL 3; the
    driver must say so instead of letting traffic pass over the TCP meta connection."""
    rendered = TincDriver.render

    def without_cnf(self, ctx, params, secrets):
        out = rendered(self, ctx, params, secrets)
        for files in out.values():
            files.pop("openssl.cnf", None)
        return out

    monkeypatch.setattr(TincDriver, "render", without_cnf)
    with pytest.raises(StartupError) as e:
        up(spec_of("pi_pair_middlebox"), lab_id, vpn="tinc")
    assert "packet key could not be set up" in str(e.value)
    assert "unsupported" in str(e.value)  # the log tail says why
    assert lab_traces(lab_id) == []


@pytest.mark.root
@needs_tinc
def test_site_to_site_through_tinc0_and_back_after_tear_down(lab_id):
    lab = up(spec_of("site_to_site"), lab_id, vpn="tinc-none")
    v = lab.info["vpn"]
    gw = lab.node(v["client"])
    targets = [v["traffic"]["v4"], v["traffic"]["v6"]]
    assert targets == ["10.2.0.2", "fd00:a2::2"]
    for addr in targets:
        lab.node("h1").run(["ping", "-c", "2", "-i", "0.2", "-W", "2", addr])
        assert json.loads(gw.run(["ip", "-j", "route", "get", addr]).stdout)[0]["dev"] == "tinc0"
    rx = int(gw.run(["cat", "/sys/class/net/tinc0/statistics/rx_packets"]).stdout)
    assert rx >= 4  # the replies came back through the tunnel

    tear_down(lab)  # tincd goes, tinc0 with it; the underlay carries the sites again
    assert "vpn" not in lab.info
    assert gw.run(["ip", "link", "show", "tinc0"], check=False).returncode != 0
    lab.node("h1").run(["ping", "-c", "1", "-W", "2", "10.2.0.2"])
    assert teardown(lab_id) == []
    assert lab_traces(lab_id) == []


@pytest.mark.root
@needs_tinc
def test_pmtu_discovery_on_clamps_to_the_path(lab_id):
    """tinc's own default: PMTU discovery on. Large DF packets then get ICMP frag-needed from
    tincd once the path MTU is known, while small ones pass."""
    lab = up(spec_of("pi_pair_middlebox"), lab_id, vpn="tinc:pmtu_discovery=true")
    try:
        client = lab.node("client")
        client.run(["ping", "-c", "2", "-i", "0.2", "-W", "2", "10.99.0.2"])
        # discovery probes run for a few seconds; poll until the full-size DF ping is refused
        df = ["ping", "-M", "do", "-s", "1472", "-c", "1", "-W", "1", "10.99.0.2"]
        deadline = time.monotonic() + 20
        while client.run(df, check=False).returncode == 0:
            assert time.monotonic() < deadline, "1500-byte DF pings still pass: no PMTU"
            time.sleep(0.5)
        client.run(["ping", "-M", "do", "-s", "1300", "-c", "1", "-W", "2", "10.99.0.2"])
        assert lab.info["vpn"]["describe"]["pmtu_discovery"] is True
    finally:
        assert teardown(lab_id) == []
    assert lab_traces(lab_id) == []
