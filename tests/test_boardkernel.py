"""A profile's data plane sections ([kernel.dataplane.X], [userspace.dataplane.X] and their
path tables; lab.model.boardkernel): bad input is refused naming the file, the field and what
that section accepts. No root."""

from __future__ import annotations

import pytest

from lab.core.errors import ConfigError
from tests.profiletext import BOARD_HEAD
from tests.profiletext import load_text as load

PROFILE = (
    BOARD_HEAD
    + """
[kernel]
version = "5.10"
[kernel.dataplane.xfrm-esp]
threading = "one-core"
source = "esp4.c"
[kernel.dataplane.xfrm-esp.crypto]
aes-128-gcm = "kernel-gcm-aes-128"
[kernel.dataplane.xfrm-esp.path]
source = "counted"
[kernel.dataplane.xfrm-esp.path.pps]
aes-128-gcm = 40000
[userspace.dataplane.openvpn.path]
source = "counted"
program = "OpenVPN 2.6"
[userspace.dataplane.openvpn.path.pps]
aes-256-cbc = 10000
"""
)
USERSPACE = PROFILE[PROFILE.index("[userspace") :]
PATH_FIELDS = "bytes, confidence, derivation, kernel, pps, source"


def test_the_profile_loads(tmp_path, monkeypatch):
    prof = load(tmp_path, monkeypatch, PROFILE)
    assert prof.kernel.dataplanes["xfrm-esp"].path.pps == {"aes-128-gcm": 40000.0}
    assert prof.kernel.dataplanes["xfrm-esp"].crypto == {"aes-128-gcm": "kernel-gcm-aes-128"}
    assert prof.userspace["openvpn"].path.program == "OpenVPN 2.6"


@pytest.mark.parametrize(
    "edit, field, accepted",
    [
        # a field of the other section's path: the kernel's counts name no program
        (
            ('[kernel.dataplane.xfrm-esp.path]\nsource = "counted"',
             '[kernel.dataplane.xfrm-esp.path]\nsource = "counted"\nprogram = "x"'),
            "kernel.dataplane.xfrm-esp.path.program",
            PATH_FIELDS,
        ),
        (
            ('program = "OpenVPN 2.6"', 'progam = "OpenVPN 2.6"'),
            "userspace.dataplane.openvpn.path.progam",
            "bytes, confidence, derivation, kernel, pps, program, source",
        ),
        (
            ('[kernel.dataplane.xfrm-esp.path]\nsource = "counted"',
             '[kernel.dataplane.xfrm-esp.path]\nsource = "counted"\npackets = 1'),
            "kernel.dataplane.xfrm-esp.path.packets",
            PATH_FIELDS,
        ),
        (
            ('[userspace.dataplane.openvpn.path]', '[userspace.dataplane.openvpn]\nthreading = "one-core"\n[userspace.dataplane.openvpn.path]'),
            "userspace.dataplane.openvpn.threading",
            "accepted: path",
        ),
        (
            (USERSPACE, '[userspace]\ndataplane = 3\n'),
            "userspace.dataplane",
            "[userspace.dataplane.NAME] tables",
        ),
        (
            ('[kernel]', '[kernel.dataplane]\nwireguard = "per-cpu"\n[kernel]'),
            "kernel.dataplane.wireguard",
            "accepted fields: crypto, path, queue, source, threading, why",
        ),
        (
            ('[userspace.dataplane.openvpn.path]', '[userspace.dataplane]\ntinc = 1\n[userspace.dataplane.openvpn.path]'),
            "userspace.dataplane.tinc",
            "accepted fields: path",
        ),
    ],
)  # fmt: skip
def test_bad_data_plane_fields_name_file_field_and_accepted(
    tmp_path, monkeypatch, edit, field, accepted
):
    assert edit[0] in PROFILE
    with pytest.raises(ConfigError) as e:
        load(tmp_path, monkeypatch, PROFILE.replace(*edit, 1))
    assert e.value.field == field
    assert str(e.value).startswith(str(tmp_path / "odd.toml"))
    assert accepted in e.value.message
