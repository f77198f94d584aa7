"""L2TP/IPsec (driver `l2tp-ipsec`, issue 20): the rendered files (IKEv1 transport mode on UDP
1701 under the l2tp driver's xl2tpd/pppd files), secrets and their redaction, parameters, and
check() naming the kernel modules it lacks. The real thing runs in the full-kernel VM:
tests/test_vpn_kernel.py::test_l2tp_ipsec_in_vm."""

from __future__ import annotations

import pytest

from lab.core.errors import ConfigError, KernelFeatureMissing
from lab.vpn.drivers import l2tp_ipsec
from lab.vpn.profiles import load_profile
from lab.vpn.tunnel import make_context, plan, prepare, redact, render, secret_values
from lab.core.hostnode import this_machine
from tests.conftest import TOPOS
from tests.fakenode import RecordingNode
from lab.model.topology import load_topology


def spec_of(name: str):
    return load_topology(TOPOS / f"{name}.py", params={"cpu": None})


def test_render_stacks_l2tp_files_on_ikev1_transport_mode():
    files = render(spec_of("pi_pair_middlebox"), "l2tp-ipsec")["files"]
    l2tp_only = render(spec_of("pi_pair_middlebox"), "l2tp")["files"]
    for node in ("client", "server"):
        fs = files[node]
        assert set(fs) == set(l2tp_only[node]) | {"strongswan.conf", "swanctl.conf"}
        # the l2tp driver's files, as it renders them (only the profile name in headers differs)
        for rel, text in l2tp_only[node].items():
            assert fs[rel].replace("l2tp-ipsec", "l2tp") == text, rel
        sw = fs["swanctl.conf"]
        assert "version = 1" in sw and "mode = transport" in sw and "dpd_timeout = 120s" in sw
        assert "esp_proposals = aes256-sha1,aes128-sha1,3des-sha1" in sw
        assert "proposals = aes256-sha1-modp2048," in sw
        assert "secret = <redacted:psk>" in sw
        conf = fs["strongswan.conf"]
        assert "# lab: data-plane kernel" in conf and "install_routes = no" in conf
        assert "kernel-libipsec" not in conf and "retransmit_timeout" not in conf
    c = files["client"]["swanctl.conf"]
    # only L2TP's UDP port between the two underlay addresses is protected
    assert "local_ts = 10.0.1.2/32[udp/1701]" in c and "remote_ts = 10.0.2.2/32[udp/1701]" in c
    assert "local_addrs = 10.0.1.2" in c and "remote_addrs = 10.0.2.2" in c
    assert "dpd_action = restart" in c and "dpd_action = clear" in files["server"]["swanctl.conf"]


def test_port_override_moves_both_xl2tpd_and_the_selectors():
    files = render(spec_of("pi_pair_middlebox"), "l2tp-ipsec:port=1702,mtu=1280")["files"]
    c = files["client"]
    assert "port = 1702" in c["xl2tpd.conf"] and "mtu 1280" in c["ppp/options.xl2tpd"]
    assert "local_ts = 10.0.1.2/32[udp/1702]" in c["swanctl.conf"]


def test_secrets_psk_and_chap_fresh_and_redacted(tmp_path):
    p = plan(spec_of("pi_pair_middlebox"), "l2tp-ipsec")
    ctx = make_context("t", p, {}, tmp_path)
    secrets = p.driver.secrets(ctx, p.profile.params)
    assert set(secrets) == {"psk", "chap_secret"}
    assert sorted(f.name for f in ctx.secrets_dir.iterdir()) == [
        "l2tp-chap-secret",
        "strongswan-psk",
    ]
    rendered = p.driver.render(ctx, p.profile.params, secrets)
    assert secrets["psk"] in rendered["client"]["swanctl.conf"]
    assert secrets["chap_secret"] in rendered["server"]["ppp/chap-secrets"]
    for fs in redact(rendered, secret_values(p.driver, secrets)).values():
        for text in fs.values():
            assert secrets["psk"] not in text and secrets["chap_secret"] not in text


@pytest.mark.parametrize(
    "override, field",
    [
        ("esp_proposals=AES!", "params.esp_proposals"),
        ("compression=lzs", "params.compression"),
        ("dataplane=userspace", "params.dataplane"),  # kernel only: no such parameter
    ],
)
def test_bad_overrides_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_profile(f"l2tp-ipsec:{override}")


def _node(config: str) -> RecordingNode:
    plugins = "".join(
        f"libstrongswan-{p}.so\n"
        for p in ("vici", "kernel-netlink", "socket-default", "openssl", "kdf")
    )
    return RecordingNode(
        {
            ("gzip", "-dc", "/proc/config.gz"): (0, config, ""),
            ("ls", "-1", "/usr/lib/ipsec/plugins"): (0, plugins, ""),
        }
    )


def test_check_names_every_missing_module():
    params = load_profile("l2tp-ipsec").params
    drv = l2tp_ipsec.L2TPIPsecDriver()
    a = drv.check(params, _node("CONFIG_XFRM=y\n"))
    assert not a.ok and a.path == "kernel" and "--vm" in a.why
    for what in ("module esp4", "module ppp_generic", "module l2tp_ppp"):
        assert what in a.why, a.why
    a = drv.check(params, _node("CONFIG_INET_ESP=m\nCONFIG_PPP=m\n"))
    assert not a.ok and "l2tp_ppp" in a.why and "esp4" not in a.why
    full = "CONFIG_INET_ESP=m\nCONFIG_PPP=m\nCONFIG_PPPOL2TP=m\n"
    assert drv.check(params, _node(full)).ok


def test_host_without_the_modules_refuses_and_says_use_vm():
    prof = load_profile("l2tp-ipsec")
    if prof.driver.check(prof.params, this_machine()).ok:
        pytest.skip("this kernel has ESP, PPP and L2TP: nothing to refuse")
    spec = spec_of("pi_pair_middlebox")
    with pytest.raises(KernelFeatureMissing, match="--vm") as e:
        prepare(spec, "l2tp-ipsec")
    assert "esp4" in str(e.value)
    prepare(spec, "l2tp-ipsec", kernel=False)  # what `lab up --vm` checks on the host
