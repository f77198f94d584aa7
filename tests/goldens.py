"""The golden rendered configs: what each profile renders on its topology, normalised, and what is
stored under tests/data. The tests compare the two; only scripts/regen-goldens.py writes the
stored files (by hand, its output reviewed in the diff), from these same functions.

A family is one directory of goldens and one way to render and normalise them:
`rendered(family, profile)` and `stored(family, profile)` map "<node>/<file>" to text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

from lab.model.topology import load_topology
from lab.vpn.tunnel import render

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
TOPOS = REPO / "topologies"


def _certs_and_wg_keys(text: str) -> str:
    """Public keys and certificates differ per render."""
    text = re.sub(r"PublicKey = \S+", "PublicKey = <public>", text)
    return re.sub(
        r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----",
        "<certificate>",
        text,
        flags=re.DOTALL,
    )


def _rsa_public_keys(text: str) -> str:
    """tinc's RSA public keys differ per render."""
    return re.sub(
        r"-----BEGIN RSA PUBLIC KEY-----.*?-----END RSA PUBLIC KEY-----",
        "<rsa public key>",
        text,
        flags=re.DOTALL,
    )


def _spis(text: str) -> str:
    """xfrm-manual's SPIs are fresh per lab."""
    return re.sub(r"spi 0x[0-9a-f]{8}", "spi <spi>", text)


def _same(text: str) -> str:
    return text


@dataclass(frozen=True)
class Family:
    directory: Path  # goldens live in <directory>/<profile>/<node>/<file>
    profiles: tuple[str, ...]
    normalize: Callable[[str], str]
    topology_params: dict | None = None  # None: the topology's defaults
    suffix: str = ""  # appended to the profile spec (e.g. a forced data plane)
    needs: tuple[str, ...] = ()  # executables the rendering runs


FAMILIES = {
    # tests/test_vpn_profiles.py
    "profiles": Family(
        DATA / "vpn",
        (
            "baseline",
            "wireguard",
            "openvpn-aes256cbc-static",
            "openvpn-tls",
            "openvpn-tls-tcp",
            "openvpn-none",
        ),
        _certs_and_wg_keys,
        {"cpu": None},
    ),
    # tests/test_vpn_l2tp.py
    "l2tp": Family(DATA / "vpn", ("l2tp",), _same, {"cpu": None}),
    # tests/test_vpn_tinc.py (rendering makes RSA keys with tincd/openssl)
    "tinc": Family(
        DATA / "vpn",
        (
            "tinc",
            "tinc-nocipher",
            "tinc-nodigest",
            "tinc-none",
            "openvpn-bf-sha1-static",
            "openvpn-nocipher-static",
            "openvpn-nodigest-static",
        ),
        _rsa_public_keys,
        {"cpu": None},
        needs=("tincd", "openssl"),
    ),
    # tests/test_vpn_xfrm.py
    "xfrm": Family(
        DATA / "vpn",
        ("ipsec-transport-ah", "ipsec-transport-esp", "ipsec-transport-ah-esp"),
        _spis,
        {"cpu": None},
    ),
    # tests/test_vpn_strongswan.py: the data plane is forced so the files do not depend on this
    # machine's kernel
    "strongswan": Family(
        DATA / "strongswan",
        ("ipsec-aes128gcm", "ipsec-aes256gcm", "ipsec-chacha20poly1305", "ipsec-modern"),
        _same,
        None,
        suffix=":dataplane=libipsec",
    ),
}

TOPOLOGY = "pi_pair_middlebox"


def rendered(family: str, profile: str) -> dict[str, str]:
    """What `profile` renders on pi_pair_middlebox, normalised: "<node>/<file>" -> text."""
    fam = FAMILIES[family]
    path = TOPOS / f"{TOPOLOGY}.py"
    spec = (
        load_topology(path)
        if fam.topology_params is None
        else load_topology(path, params=fam.topology_params)
    )
    files = render(spec, profile + fam.suffix)["files"]
    return {f"{n}/{r}": fam.normalize(t) for n, fs in files.items() for r, t in fs.items()}


def stored(family: str, profile: str) -> dict[str, str]:
    """The golden files on disk for `profile`: "<node>/<file>" -> text (empty if none)."""
    gold = FAMILIES[family].directory / profile
    if not gold.exists():
        return {}
    return {str(p.relative_to(gold)): p.read_text() for p in gold.rglob("*") if p.is_file()}
