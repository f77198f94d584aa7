"""`lab render` to stdout and `lab profiles NAME` (issue 21): no root, no lab."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

import lab.cli.profiles as cliprofiles
from lab.cli.main import main
from lab.vpn.profiles import known_profiles, load_profile

PI_PAIR = str(Path(__file__).resolve().parent.parent / "topologies" / "pi_pair.py")
HEADER = re.compile(r"^==> (\S+)/(\S+) <==$", re.M)


def _files_under(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()}


@pytest.mark.parametrize("vpn", ["wireguard", "openvpn-tls"])
def test_render_to_stdout(vpn, tmp_path, capsys):
    """Without --out: every file --out would write, under a header naming node and file, with
    the secrets redacted; nothing written anywhere."""
    assert main(["render", PI_PAIR, "--vpn", vpn, "--out", str(tmp_path / "o")]) == 0
    capsys.readouterr()
    assert main(["render", PI_PAIR, "--vpn", vpn]) == 0
    text = capsys.readouterr().out
    shown = {f"{node}/{rel}" for node, rel in HEADER.findall(text)}
    assert shown and shown == _files_under(tmp_path / "o")
    assert "<redacted:" in text
    assert not re.search(r"PrivateKey = [A-Za-z0-9+/]{42,}=", text)
    assert "PRIVATE KEY-----" not in text
    # each file's text follows its header verbatim
    for node, rel in HEADER.findall(text):
        body = text.split(f"==> {node}/{rel} <==\n", 1)[1]
        first = (tmp_path / "o" / node / rel).read_text().splitlines()[0]
        assert body.splitlines()[0] == first


def test_render_show_secrets_needs_out(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["render", PI_PAIR, "--vpn", "wireguard", "--show-secrets"]) == 2
    cap = capsys.readouterr()
    assert "--show-secrets" in cap.err and "--out" in cap.err
    assert cap.out == "" and list(tmp_path.iterdir()) == []


def test_render_show_secrets_with_out(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["render", PI_PAIR, "--vpn", "wireguard", "--out", str(out), "--show-secrets"]) == 0
    conf = out / "client" / "wg0.conf"
    assert re.search(r"PrivateKey = [A-Za-z0-9+/]{42,}=", conf.read_text())
    assert conf.stat().st_mode & 0o777 == 0o600


def test_profile_parameters_json(capsys):
    """Every shipped profile: one row per parameter of its driver, with the profile's value, the
    driver's default, the type and the accepted values."""
    for name in known_profiles():
        assert main(["profiles", name, "--json"]) == 0, name
        rec = json.loads(capsys.readouterr().out)
        prof = load_profile(name)
        rows = {r["param"]: r for r in rec["parameters"]}
        assert list(rows) == list(prof.driver.params), name
        for key, p in prof.driver.params.items():
            r = rows[key]
            assert r["value"] == prof.params[key] and r["default"] == p.default, (name, key)
            assert r["type"] and r["accepted"], (name, key)
        assert rec["name"] == name and rec["driver"] == prof.driver_name


def test_profile_parameters_table_with_override(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr(cliprofiles, "out", Console(file=buf, width=300))
    assert main(["profiles", "ipsec-modern:mtu=1380,dataplane=libipsec"]) == 0
    text = buf.getvalue()
    line = next(ln for ln in text.splitlines() if re.search(r"\bmtu\b", ln))
    cells = [c.strip() for c in re.split(r"[│┃|]", line) if c.strip()]
    assert cells[:5] == ["mtu", "int", "1380 *", "1400", "int >= 1280 and <= 9000"]
    line = next(ln for ln in text.splitlines() if "dataplane" in ln)
    assert "one of 'auto', 'kernel', 'libipsec'" in line and "libipsec *" in line
    assert "encap" in text and "true or false" in text


def test_profile_list_says_which_profiles_rekey_on_demand(monkeypatch, capsys):
    """`lab profiles`: a column (and in --json a field) from Driver.rekey_support, what the
    handshake test's forced rekey needs; `lab profiles NAME` says how, or why not."""
    static = "openvpn-aes256cbc-static"
    assert main(["profiles", "--json"]) == 0
    rows = {r["profile"]: r for r in json.loads(capsys.readouterr().out)}
    for name, r in rows.items():
        if r["driver"] is None:  # a broken file: no driver to ask
            assert r["rekey"] is None, name
            continue
        prof = load_profile(name)
        want = prof.driver.rekey_support(prof.params)
        assert r["rekey"] == {"ok": want.ok, "how": want.how}, name
    assert rows["ipsec-modern"]["rekey"]["ok"] and not rows["wireguard"]["rekey"]["ok"]
    assert rows["openvpn-tls"]["rekey"]["ok"] and not rows[static]["rekey"]["ok"]

    buf = io.StringIO()
    monkeypatch.setattr(cliprofiles, "out", Console(file=buf, width=400))
    assert main(["profiles"]) == 0
    lines = buf.getvalue().splitlines()
    head = next(ln for ln in lines if "rekey on demand" in ln)
    cols = [c.strip() for c in re.split(r"[│┃|]", head)[1:-1]]
    at = cols.index("rekey on demand")
    for name, want in [("ipsec-modern", "yes"), ("wireguard", "no"), (static, "no")]:
        line = next(ln for ln in lines if re.match(rf"│ {re.escape(name)} +│", ln))
        assert [c.strip() for c in line.split("│")[1:-1]][at] == want, line

    buf.truncate(0)
    assert main(["profiles", static]) == 0
    assert "rekey on demand: no: static-key mode has no key exchange" in buf.getvalue()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["profiles", "nosuch"], ["lab profiles NAME", "unknown VPN profile 'nosuch'", "valid:"]),
        (["profiles", "wireguard:bogus=1"], ["params.bogus", "accepted:", "listen_port"]),
        (["profiles", "wireguard:mtu=1"], ["params.mtu", "accepted:"]),
    ],
)
def test_profile_bad_name(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err, err
