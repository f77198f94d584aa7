"""Bring your own configs (issue 23, docs/byoc.md): the example configs of docs/examples/byoc/
imported with `lab profiles import`, rendered back (only the placeholders' lines differ from the
user's file), brought up on pi_pair_middlebox (ping, 1 s iperf3, plaintext marker absent on the
wire, nothing left after down), and a broken edit of each refused naming the user's file and
line or the daemon's own log line, with nothing left behind."""

from __future__ import annotations

import difflib
import json
import re
import shutil
import time
from pathlib import Path

import pytest

from lab.core import proc
from lab.core.errors import ConfigError, LabError, StartupError
from lab.substrate.local.build import up
from lab.core.teardown import teardown
from lab.model.topology import load_topology
from lab.vpn import byocimport, tunnel
from lab.vpn.charon import CHARON
from lab.vpn.profiles import load_profile
from lab.vpn.userconfig import SPECS
from tests.conftest import REPO, TOPOS, lab_traces, run_lab
from tests.tunnelprobe import capture_marker

EXAMPLES = REPO / "docs" / "examples" / "byoc"
#: name -> the example files, the initiator's / client's first where there are two
CASES = {
    "wireguard": ["wireguard/wg0.conf"],
    "openvpn": ["openvpn/server.conf", "openvpn/client.ovpn"],
    "strongswan": ["strongswan/moon.swanctl.conf", "strongswan/sun.swanctl.conf"],
}
TOOLS = {
    "wireguard": ("wg", "wireguard-go"),
    "openvpn": ("openvpn", "openssl"),
    "strongswan": (CHARON, "swanctl"),
}


def spec():
    return load_topology(TOPOS / "pi_pair_middlebox.py", params={"cpu": None})


def imported(case: str, tmp: Path, name: str = "team") -> tuple[Path, byocimport.Imported]:
    imp = byocimport.import_files([EXAMPLES / f for f in CASES[case]])
    out = tmp / f"{name}.toml"
    byocimport.write(imp, out)
    return out, imp


# ------------------------------------------------------------------------ no root


@pytest.mark.parametrize("case", CASES)
def test_import_round_trip_changes_only_placeholder_lines(case, tmp_path):
    profile, imp = imported(case, tmp_path)
    result = tunnel.render(spec(), str(profile))
    if len(imp.templates) == 1:  # one file for both ends
        files = {"client": imp.templates[0], "server": imp.templates[0]}
    else:
        files = {t.role: t for t in imp.templates}
    rendered_by_role = {
        "client": result["files"][result["client"]],
        "server": result["files"][result["server"]],
    }
    for role, tpl in files.items():
        original = tpl.source.read_text().splitlines()
        rendered = rendered_by_role[role][SPECS[case].file]
        differing = set()
        for tag, i1, i2, _j1, _j2 in difflib.SequenceMatcher(
            None, original, rendered.splitlines(), autojunk=False
        ).get_opcodes():
            if tag != "equal":
                differing.update(range(i1 + 1, i2 + 1))
        assert differing, "the lab's values never reached the file"
        # every line that differs is one the import replaced by a placeholder or commented out
        assert differing <= tpl.changed, sorted(differing - tpl.changed)
        noted = {n.line for n in imp.notes if n.file == str(tpl.source)}
        for n in noted:
            assert byocimport.COMMENTED in tpl.lines[n - 1] or n in tpl.changed
    for t in imp.templates:  # the user's keys/placeholders never reach the templates
        assert "PLACEHOLDER" not in t.text and "0sPLACEHOLDER" not in t.text


def test_import_lists_what_it_cannot_carry_with_line_numbers(tmp_path):
    profile, imp = imported("wireguard", tmp_path)
    wg = EXAMPLES / "wireguard" / "wg0.conf"
    dns = next(n for n, line in enumerate(wg.read_text().splitlines(), 1) if line.startswith("DNS"))
    assert [(n.line, n.text) for n in imp.notes] == [(dns, "DNS = 10.200.100.1")]
    cp = run_lab("profiles", "import", wg, "--out", tmp_path / "cli.toml")
    assert cp.returncode == 0, cp.stderr
    assert f"{wg}:{dns}: DNS = 10.200.100.1" in cp.stdout
    assert load_profile(str(tmp_path / "cli.toml")).configs["client"].names >= {"private_key"}


def test_missing_and_unknown_placeholders_name_the_file(tmp_path):
    profile, imp = imported("wireguard", tmp_path)
    tpl = tmp_path / "team.wg0.conf.j2"
    tpl.write_text(tpl.read_text().replace("{{ private_key }}", "uDrjrIyGw1Wf3Re4jnpDNg=="))
    with pytest.raises(ConfigError) as e:
        load_profile(str(profile))
    assert str(tpl) in str(e.value) and "{{ private_key }}" in str(e.value)
    tpl.write_text(tpl.read_text() + "# {{ pirvate_key }}\n")
    with pytest.raises(ConfigError, match=r"unknown placeholder\(s\) pirvate_key; valid"):
        load_profile(str(profile))


def test_wg_quick_mtu_and_listen_port_are_read_when_the_profile_loads(tmp_path):
    """A wg-quick file's own MTU and whether it gives a ListenPort are read once, at load (the
    driver applies them): the last [Interface] MTU; none, or one in a [Peer], leaves the
    profile's `mtu`."""
    profile, _ = imported("wireguard", tmp_path)
    configs = load_profile(str(profile)).configs.values()
    assert {(c.mtu, c.listen_port) for c in configs} == {(None, False)}
    tpl = tmp_path / "team.wg0.conf.j2"
    text = tpl.read_text()
    mtus = "[Interface]\nMTU = 1300\nListenPort = {{ listen_port }}\nMTU = 1380\n"
    tpl.write_text(text.replace("[Interface]\n", mtus, 1))
    configs = load_profile(str(profile)).configs.values()
    assert {(c.mtu, c.listen_port) for c in configs} == {(1380, True)}
    tpl.write_text(text.replace("[Peer]\n", "[Peer]\nMTU = 1380\nListenPort = 1\n", 1))
    configs = load_profile(str(profile)).configs.values()
    assert {(c.mtu, c.listen_port) for c in configs} == {(None, False)}


# ------------------------------------------------------------------------ root: real tunnels


def need(case: str) -> None:
    missing = [t for t in (*TOOLS[case], "tcpdump", "iperf3") if not proc.which(t)]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")


def iperf3_1s(lab, addr: str) -> int:
    client, server = lab.node("client"), lab.node("server")
    srv = server.spawn("iperf3", ["iperf3", "-s", "-1", "-B", addr])
    deadline = time.monotonic() + 5
    try:
        while True:  # the server needs a moment to listen
            cp = client.run(["iperf3", "-c", addr, "-t", "1", "-J"], check=False, timeout=20)
            if cp.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        server.stop(srv)
    assert cp.returncode == 0, cp.stdout[-300:] + cp.stderr
    return json.loads(cp.stdout)["end"]["sum_received"]["bytes"]


@pytest.mark.root
@pytest.mark.parametrize("case", CASES)
def test_imported_example_runs_on_pi_pair_middlebox(case, lab_id, tmp_path):
    need(case)
    profile, _ = imported(case, tmp_path)
    lab = up(spec(), lab_id, vpn=str(profile))
    try:
        v = lab.info["vpn"]
        assert set(v["describe"]["user_configs"]) == {"client", "server"}
        target = v["traffic"]["v4"]
        lab.node("client").run(["ping", "-c", "2", "-i", "0.2", "-W", "2", target])
        assert iperf3_1s(lab, target) > 0
        seen, size = capture_marker(lab, target)
        assert size > 200 and not seen, "plaintext marker on the wire"
    finally:
        assert teardown(lab_id) == []
    assert lab_traces(lab_id) == []


def _break(case: str, tmp: Path) -> tuple[Path, Path, str]:
    """(profile, the edited user file, the edited line's text)."""
    profile, _ = imported(case, tmp)
    edits = {  # file, pattern, replacement
        "wireguard": ("team.wg0.conf.j2", r"AllowedIPs = .*", "AllowedIPs = 10.0.0.0/24"),
        "openvpn": (
            "team.client.client.ovpn.j2",
            r"data-ciphers .*",
            "data-ciphers AES-256-GCM:AES-512-XTS",
        ),
        "strongswan": (
            "team.server.sun.swanctl.conf.j2",
            r"proposals = aes128-sha256-x25519",
            "proposals = aes256-sha512-modp4096",
        ),
    }
    name, pat, new = edits[case]
    path = tmp / name
    text, n = re.subn(pat, new, path.read_text(), count=1)
    assert n == 1
    path.write_text(text)
    return profile, path, new


@pytest.mark.root
@pytest.mark.parametrize("case", CASES)
def test_broken_edit_is_refused_naming_the_file_and_line(case, lab_id, tmp_path):
    need(case)
    profile, path, line_text = _break(case, tmp_path)
    lineno = [s.strip() for s in path.read_text().splitlines()].index(line_text) + 1
    with pytest.raises(LabError) as e:
        up(spec(), lab_id, vpn=str(profile))
    msg = str(e.value)
    if case == "strongswan":  # only the negotiation tells: the daemon's own line, and where
        assert isinstance(e.value, StartupError)
        assert "received proposals unacceptable" in msg or "NO_PROPOSAL_CHOSEN" in msg
        assert f"{path} line {lineno}: {line_text}" in msg
    else:
        assert isinstance(e.value, ConfigError)
        assert f"{path}: line {lineno} ({line_text!r})" in msg
    assert lab_traces(lab_id) == []
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_docs_list_every_placeholder():
    from lab.vpn.userconfig import COMMON

    doc = (REPO / "docs" / "byoc.md").read_text()
    names = set(COMMON) | {n for s in SPECS.values() for n in s.placeholders}
    assert [n for n in sorted(names) if "{{ " + n + " }}" not in doc] == []


def test_import_refuses_bad_input_and_writes_nothing(tmp_path):
    bad = tmp_path / "wg0.conf"
    bad.write_text(
        "[Interface]\nAddress = 10.0.0.1/24\nPrivateKey = x\n[Peer]\nAllowedIPs = 10.0.0.x\n"
    )
    out = tmp_path / "p.toml"
    with pytest.raises(ConfigError, match=r"wg0.conf: line 5: '10.0.0.x' is not an address"):
        byocimport.import_profile([str(bad)], str(out))
    # a file without a [Peer] PublicKey imports, but the profile would not load: undone
    bad.write_text("[Interface]\nAddress = 10.0.0.1/24\nPrivateKey = x\n")
    with pytest.raises(ConfigError, match=r"\{\{ peer_public_key \}\}"):
        byocimport.import_profile([str(bad)], str(out))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wg0.conf"]
    out.write_text("# mine\n")
    with pytest.raises(ConfigError, match="exists"):
        byocimport.import_profile([str(EXAMPLES / "wireguard" / "wg0.conf")], str(out))
    assert out.read_text() == "# mine\n" and len(list(tmp_path.iterdir())) == 2


# ------------------------------------------------------------------------ the user's addressing

WG_SERVER = """[Interface]
# our office gateway
Address = 172.30.9.1/24
ListenPort = 51820
PrivateKey = aGVsbG8gd29ybGQgdGhpcyBpcyBub3QgYSByZWFsIGs=

[Peer]
PublicKey = aGVsbG8gd29ybGQgdGhpcyBpcyBub3QgYSByZWFsIGs=
AllowedIPs = 172.30.9.2/32
"""
WG_CLIENT = """[Interface]
Address = 172.30.9.2/24
PrivateKey = aGVsbG8gd29ybGQgdGhpcyBpcyBub3QgYSByZWFsIGs=

[Peer]
PublicKey = aGVsbG8gd29ybGQgdGhpcyBpcyBub3QgYSByZWFsIGs=
Endpoint = vpn.example.com:51820
AllowedIPs = 172.30.9.0/24
PersistentKeepalive = 25
"""


def ipv4_pair(tmp: Path, server: str = WG_SERVER, client: str = WG_CLIENT) -> Path:
    (tmp / "server.conf").write_text(server)
    (tmp / "client.conf").write_text(client)
    out = tmp / "wg.toml"
    cp = run_lab("profiles", "import", tmp / "server.conf", tmp / "client.conf", "--out", out)
    assert cp.returncode == 0, cp.stderr
    return out


def test_ipv4_only_wg_quick_pair_keeps_its_addresses(tmp_path):
    out = ipv4_pair(tmp_path)
    assert load_profile(str(out)).tunnel == {
        "client": ("172.30.9.2/24", ""),
        "server": ("172.30.9.1/24", ""),
    }
    files = tunnel.render(spec(), str(out))["files"]
    client, server = files["client"]["wg0.conf"], files["server"]["wg0.conf"]
    assert "Address = 172.30.9.2/24\n" in client and "AllowedIPs = 172.30.9.0/24\n" in client
    assert "Address = 172.30.9.1/24\n" in server and "AllowedIPs = 172.30.9.2/32\n" in server
    assert "fd99" not in client + server and "10.99." not in client + server
    p = tunnel.plan(spec(), str(out))
    assert p.tunnel_addrs(p.client) == ("172.30.9.2/24", "")
    assert p.traffic_target(spec()) == {"v4": "172.30.9.1", "v6": None}


def test_import_says_what_it_replaced_in_the_underlay(tmp_path):
    cp_out = ipv4_pair(
        tmp_path, WG_SERVER.replace("172.30.9", "10.0.2"), WG_CLIENT.replace("172.30.9", "10.0.2")
    )
    cp = run_lab(
        "profiles",
        "import",
        tmp_path / "server.conf",
        tmp_path / "client.conf",
        "--out",
        tmp_path / "again.toml",
    )
    said = " ".join(cp.stdout.split())  # the console wraps long lines
    assert "replaced:" in said and "10.0.2.0/24 falls in the lab's underlay" in said
    assert "the lab's 10.99.0.0/24 replaces it" in said
    assert load_profile(str(cp_out)).tunnel == {
        "client": ("10.99.0.1/24", ""),
        "server": ("10.99.0.2/24", ""),
    }


def test_tunnel_table_checked_at_load_and_against_the_topology(tmp_path):
    out = ipv4_pair(tmp_path)
    text = out.read_text()
    out.write_text(text.replace('client = ["172.30.9.2/24"]', 'client = ["10.0.2.9/24"]'))
    with pytest.raises(ConfigError, match=r"overlaps the underlay segment 10.0.2.0/24") as e:
        tunnel.plan(spec(), str(out))
    assert "wg.toml" in str(e.value) and "tunnel.client" in str(e.value)
    out.write_text(text.replace('client = ["172.30.9.2/24"]', 'client = ["fd99::1/64"]'))
    with pytest.raises(ConfigError, match="needs an IPv4 address"):
        load_profile(str(out))
    out.write_text(text.replace('client = ["172.30.9.2/24"]', 'client = ["172.30.9.2"]'))
    with pytest.raises(ConfigError, match="not an address with prefix"):
        load_profile(str(out))


def test_allowed_ips_error_quotes_the_allowed_ips_line(tmp_path):
    out = ipv4_pair(tmp_path)
    # the user's tunnel with IPv6 on both ends, the client's AllowedIPs without it
    text = out.read_text().replace('2/24"]', '2/24", "fd42::2/64"]')
    out.write_text(text.replace('1/24"]', '1/24", "fd42::1/64"]'))
    with pytest.raises(ConfigError) as e:
        tunnel.render(spec(), str(out))
    assert "line 8 ('AllowedIPs = {{ tunnel_prefix_v4 }}')" in str(e.value)
    assert "fd42::1" in str(e.value) and "{{ peer_tunnel_v6 }}/128" in str(e.value)


@pytest.mark.root
def test_ipv4_only_wg_quick_pair_runs_as_written(lab_id, tmp_path):
    need("wireguard")
    out = ipv4_pair(tmp_path)
    lab = up(spec(), lab_id, vpn=str(out))
    try:
        v = lab.info["vpn"]
        assert v["traffic"]["v4"] == "172.30.9.1" and v["traffic"]["v6"] is None
        cp = lab.node("client").run(["ping", "-c", "2", "-i", "0.2", "-W", "2", "172.30.9.1"])
        assert cp.returncode == 0
        addrs = lab.node("client").run(["ip", "-br", "addr", "show", "wg0"]).stdout
        assert "172.30.9.2/24" in addrs and "fd99" not in addrs
    finally:
        assert teardown(lab_id) == []
    assert lab_traces(lab_id) == []


def test_import_creates_the_out_directory_and_removes_it_when_refused(tmp_path):
    wg = EXAMPLES / "wireguard" / "wg0.conf"
    out = tmp_path / "team" / "sub" / "wg.toml"
    cp = run_lab("profiles", "import", wg, "--out", out)
    assert cp.returncode == 0, cp.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["wg.toml", "wg.wg0.conf.j2"]
    (tmp_path / "ref").mkdir()  # the mode any other directory gets (the umask's)
    assert out.parent.stat().st_mode & 0o777 == (tmp_path / "ref").stat().st_mode & 0o777
    bad = tmp_path / "bad.conf"
    bad.write_text("[Interface]\nAddress = 10.200.1.1/24\nPrivateKey = x\n")  # no PublicKey
    cp = run_lab("profiles", "import", bad, "--out", tmp_path / "new" / "dir" / "p.toml")
    assert cp.returncode == 2 and "peer_public_key" in cp.stderr
    assert not (tmp_path / "new").exists()
