"""VPN profiles without root: registry, validation, placement, rendering of every profile for
every shipped topology (catalogue), golden configs, secrets and redaction."""

from __future__ import annotations

import base64
import re
import stat
import subprocess
from pathlib import Path

import pytest

from tests import goldens
from lab.core import proc
from lab.core.errors import ConfigError
from lab.model.topology import load_topology
from lab.vpn import driver_classes, get_driver
from lab.vpn.profiles import known_profiles, load_profile, split_spec
from lab.vpn.tunnel import TUNNEL_V4, plan, redact, render, write_rendered
from lab.vpn.tunneladdr import tunnel_routes
from lab.vpn.drivers.wireguard import genkey, setconf_text, x25519

REPO = Path(__file__).resolve().parent.parent
TOPOLOGIES = sorted((REPO / "topologies").glob("*.py"))
MINE = (
    "baseline",
    "wireguard",
    "openvpn-aes256cbc-static",
    "openvpn-tls",
    "openvpn-tls-tcp",
    "openvpn-none",
)
# every profile on this machine, whoever wrote its driver (strongSwan ones included)
ALL = known_profiles()


def spec_of(name: str):
    return load_topology(REPO / "topologies" / f"{name}.py", params={"cpu": None})


# ------------------------------------------------------------------------- registry + profiles


def test_registry_discovers_drivers():
    assert {"none", "wireguard", "openvpn"} <= set(driver_classes())
    assert set(MINE) <= set(ALL)


def test_unknown_profile_lists_valid_ones():
    with pytest.raises(ConfigError) as e:
        load_profile("wireguardd")
    msg = str(e.value)
    assert "--vpn" in msg and "unknown VPN profile 'wireguardd'" in msg
    for name in MINE:
        assert name in msg


def test_unknown_driver_lists_valid_ones(tmp_path):
    f = tmp_path / "x.toml"
    f.write_text('driver = "no-such-driver"\n')
    with pytest.raises(ConfigError) as e:
        load_profile(str(f))
    msg = str(e.value)
    assert str(f) in msg and "driver" in msg and "'no-such-driver'" in msg
    assert "openvpn" in msg and "wireguard" in msg and "none" in msg
    with pytest.raises(ConfigError, match="valid: .*openvpn"):
        get_driver("nope")


def test_bad_cipher_names_file_field_and_choices(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('driver = "openvpn"\n[params]\ncipher = "AES-999-XYZ"\n')
    with pytest.raises(ConfigError) as e:
        load_profile(str(f))
    msg = str(e.value)
    assert str(f) in msg and "params.cipher" in msg and "AES-256-CBC" in msg and "none" in msg


@pytest.mark.parametrize(
    "spec, field, words",
    [
        ("wireguard:mtu=99", "params.mtu", "accepted: int >= 1280 and <= 9000"),
        ("wireguard:mtu=big", "params.mtu", "int"),
        ("wireguard:mtuu=1280", "params.mtuu", "listen_port"),
        ("wireguard:mtu", "", "key=value"),
        ("wireguard:implementation=magic", "params.implementation", "wireguard-go"),
        ("openvpn-aes256cbc-static:cipher=AES-256-GCM", "params.cipher", "needs TLS"),
        ("openvpn-tls:cipher=none", "params.cipher", "static-key only"),
        ("openvpn-none:keepalive_timeout=5", "params.keepalive_timeout", "twice"),
        ("baseline:mtu=1400", "params.mtu", "(none)"),
    ],
)
def test_bad_override_is_a_clear_config_error(spec, field, words):
    with pytest.raises(ConfigError) as e:
        load_profile(spec)
    msg = str(e.value)
    assert msg.startswith("--vpn"), msg
    assert field in msg and words in msg, msg


def test_overrides_are_typed_and_recorded():
    p = load_profile("wireguard:mtu=1280,listen_port=51821")
    assert p.params["mtu"] == 1280 and p.params["listen_port"] == 51821
    assert p.overrides == {"mtu": 1280, "listen_port": 51821}
    assert split_spec("x:a=1, b=2") == ("x", {"a": "1", "b": "2"})


def test_profile_file_unknown_key(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('driver = "none"\nstudyy = "A"\n')
    with pytest.raises(ConfigError, match=r"studyy.*valid: driver, description, study, params"):
        load_profile(str(f))


# ------------------------------------------------------------------------- placement


def test_placement_per_topology():
    p = plan(spec_of("pi_pair_middlebox"), "wireguard")
    assert (p.client.node, p.client.underlay_v4, p.client.underlay_if) == (
        "client",
        "10.0.1.2",
        "client-eth0",
    )
    assert (p.server.node, p.server.underlay_v4) == ("server", "10.0.2.2")
    assert p.client.behind == p.server.behind == []
    assert p.traffic_target(spec_of("pi_pair_middlebox")) == {"v4": "10.99.0.2", "v6": "fd99::2"}

    rut = spec_of("router_under_test")
    p = plan(rut, "wireguard")
    assert (p.client.node, p.client.underlay_v4) == ("router", "10.0.0.1")
    assert p.client.behind == ["192.168.1.0/24", "fd00:192::/64"] and p.server.behind == []
    assert p.traffic_client == "lan" and p.traffic_target(rut)["v4"] == "10.99.0.2"
    # the LAN host reaches the tunnel nets through the router
    assert (
        "lan",
        ["ip", "-6", "route", "replace", "fd99::/64", "via", "fd00:192::1", "dev", "lan-eth0"],
    ) in tunnel_routes(rut, p.driver, p.client, p.server)

    s2s = spec_of("site_to_site")
    p = plan(s2s, "openvpn-none")
    assert p.client.behind == ["10.1.0.0/24", "fd00:a1::/64"]
    assert p.server.behind == ["10.2.0.0/24", "fd00:a2::/64"]
    assert p.traffic_target(s2s) == {"v4": "10.2.0.2", "v6": "fd00:a2::2"}

    base = plan(spec_of("pi_pair_middlebox"), "baseline")
    assert base.tunnel_addrs(base.server) == ("10.0.2.2/24", "fd00:2::2")
    base = plan(rut, "baseline")
    assert tunnel_routes(spec_of("router_under_test"), base.driver, base.client, base.server) == []


# ------------------------------------------------------------------------- catalogue


@pytest.mark.parametrize("topo", TOPOLOGIES, ids=lambda p: p.stem)
@pytest.mark.parametrize("profile", ALL)
def test_catalogue_every_profile_renders_for_every_topology(topo, profile, tmp_path):
    spec = load_topology(topo, params={"cpu": None})
    prof = load_profile(profile)
    if not prof.driver.has_tunnel and prof.driver_name != "none":
        # transport mode (xfrm-manual) protects only what the VPN endpoints send each other:
        # a topology whose traffic endpoints are elsewhere is refused, naming why
        if spec.endpoints("traffic") != spec.endpoints("vpn"):
            with pytest.raises(ConfigError, match="transport mode"):
                render(spec, profile)
            return
    res = render(spec, profile)
    assert res["profile"]["driver"] == prof.driver_name
    client, server = spec.endpoints("vpn")
    assert (res["client"], res["server"]) == (client, server)
    files = res["files"]
    if prof.driver_name == "none":
        assert files == {}
        return
    assert set(files) == {client, server}
    for node, fs in files.items():
        assert fs, node
        for rel, text in fs.items():
            assert text.strip(), (node, rel)
            assert "<redacted:" in text or prof.driver_name not in ("wireguard", "openvpn"), rel
            assert "PRIVATE KEY" not in text and "BEGIN OpenVPN Static key" not in text
    written = write_rendered(res, tmp_path)
    assert len(written) == sum(len(f) for f in files.values())
    if prof.driver_name == "wireguard":
        _check_wireguard(spec, files, client, server, prof.params)
    if prof.driver_name == "openvpn":
        _check_openvpn(spec, files, client, server, prof.params)


def _check_wireguard(spec, files, client, server, params):
    p = plan(spec, "wireguard")
    c, s = files[client]["wg0.conf"], files[server]["wg0.conf"]
    assert "Address = 10.99.0.1/24, fd99::1/64" in c and "Address = 10.99.0.2/24, fd99::2/64" in s
    assert f"Endpoint = {p.server.underlay_v4}:{params['listen_port']}" in c
    assert f"Endpoint = {p.client.underlay_v4}:{params['listen_port']}" in s
    assert f"ListenPort = {params['listen_port']}" in c
    # each side allows the peer's tunnel address and the networks behind the peer
    assert "AllowedIPs = " + ", ".join(["10.99.0.2/32", "fd99::2/128", *p.server.behind]) in c
    assert "AllowedIPs = " + ", ".join(["10.99.0.1/32", "fd99::1/128", *p.client.behind]) in s
    # what goes to `wg setconf`: the wg-quick-only keys stripped
    keys = {
        ln.split("=")[0].strip()
        for ln in setconf_text(c).splitlines()
        if "=" in ln and ln[0] != "#"
    }
    assert keys == {"ListenPort", "PrivateKey", "PublicKey", "AllowedIPs", "Endpoint"}


def _check_openvpn(spec, files, client, server, params):
    p = plan(spec, "openvpn-tls")
    c, s = files[client]["openvpn.conf"], files[server]["openvpn.conf"]
    assert f"remote {p.server.underlay_v4} {params['port']}" in c
    assert f"remote {p.client.underlay_v4} {params['port']}" in s
    assert "ifconfig 10.99.0.1 255.255.255.0" in c and "ifconfig-ipv6 fd99::1/64 fd99::2" in c
    if params["mode"] == "static":
        assert f"cipher {params['cipher']}" in c and f"auth {params['auth']}" in c
        assert "<redacted:static_key>" in c and "key-direction 1" in c and "key-direction 0" in s
    else:
        assert f"data-ciphers {params['cipher']}" in c
        assert "tls-client" in c and "tls-server" in s and "remote-cert-tls server" in c
        assert "<redacted:client_key>" in c and "<redacted:server_key>" in s
        assert "BEGIN CERTIFICATE" in c  # certificates are public


@pytest.mark.parametrize("profile", goldens.FAMILIES["profiles"].profiles)
def test_golden_configs_pi_pair_middlebox(profile):
    """tests/data/vpn/<profile>/; after an intended change run scripts/regen-goldens.py."""
    got = goldens.rendered("profiles", profile)
    assert got == goldens.stored("profiles", profile)
    assert bool(got) == (profile != "baseline")  # only baseline renders nothing


# ------------------------------------------------------------------------- secrets


def test_x25519_rfc7748_vector_and_wg_pubkey():
    # RFC 7748 section 5.2, first vector
    k = bytes.fromhex("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4")
    u = bytes.fromhex("e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c")
    assert x25519(k, u).hex() == "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552"
    if proc.which("wg"):
        priv, pub = genkey()
        out = subprocess.run(
            ["wg", "pubkey"], input=priv, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == pub
    assert len(base64.b64decode(genkey()[0])) == 32


@pytest.mark.parametrize("profile", ["wireguard", "openvpn-aes256cbc-static", "openvpn-tls"])
def test_secrets_are_0600_in_0700_dir_and_redacted(profile, tmp_path):
    from lab.vpn.tunnel import make_context, secret_values

    p = plan(spec_of("pi_pair_middlebox"), profile)
    ctx = make_context("t", p, {}, tmp_path)
    secrets = p.driver.secrets(ctx, p.profile.params)
    assert stat.S_IMODE(ctx.secrets_dir.stat().st_mode) == 0o700
    files = list(ctx.secrets_dir.iterdir())
    assert files
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    rendered = p.driver.render(ctx, p.profile.params, secrets)
    hidden = secret_values(p.driver, secrets)
    assert hidden
    red = redact(rendered, hidden)
    for fs in red.values():
        for text in fs.values():
            for value in hidden.values():
                assert value.strip() not in text


def test_show_secrets_keeps_keys(tmp_path):
    res = render(spec_of("pi_pair"), "wireguard", show_secrets=True)
    assert not res["redacted"]
    conf = res["files"]["client"]["wg0.conf"]
    assert "<redacted" not in conf and re.search(r"PrivateKey = [A-Za-z0-9+/]{43}=", conf)
    (path,) = [p for p in write_rendered(res, tmp_path) if p.parent.name == "client"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_tunnel_net_constants():
    assert str(TUNNEL_V4) == "10.99.0.0/24"
