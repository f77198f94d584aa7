"""The board's data planes (lab.model.boardkernel, lab.substrate.local.dataplane): the [kernel]
table, the share and the number of groups a data plane gets, the drivers' declarations. No root."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab.core.errors import ConfigError
from lab.model import boardkernel
from lab.model.boardkernel import DataPlaneCpu
from lab.model.cpuprofile import load_cpu_profile
from lab.substrate.local.dataplane import dataplane_plan
from lab.vpn.drivers.openvpn import OpenVPNDriver
from lab.vpn.drivers.strongswan import StrongSwanDriver, esp_primitive
from lab.vpn.drivers.wireguard import WireGuardDriver

PROFILE = """
cores = 4
core_share = 0.25
[env]
OPENSSL_ia32cap = "~0x200000200000000"
[reference.aes-128-gcm]
mbps = 70
source = "openssl on the board"
[reference.aes-256-cbc]
mbps = 60
source = "openssl on the board"
[reference.kernel-gcm-aes-128]
mbps = 20
source = "tcrypt on the board"
implementation = "rfc4106(gcm_base(ctr-aes-neonbs,ghash-generic))"
kernel = "5.10 armv7l"
[kernel]
version = "5.10"
arch = "armv7l"
[kernel.dataplane.xfrm-esp]
threading = "one-core"
source = "esp4.c"
[kernel.dataplane.xfrm-esp.crypto]
aes-128-gcm = "kernel-gcm-aes-128"
[kernel.dataplane.wireguard]
threading = "per-cpu"
source = "queueing.c"
"""


@pytest.fixture
def board(tmp_path, monkeypatch):
    d = tmp_path / "profiles"
    d.mkdir()
    (d / "board.toml").write_text(PROFILE)
    monkeypatch.setenv("LAB_CPU_PROFILES", str(d))
    cal = tmp_path / "cal"
    monkeypatch.setenv("LAB_CALIBRATION_DIR", str(cal))
    return d, cal


def calibrate(
    cal, rates: dict[str, float], standins: dict[str, float] | None = None, size: int | None = None
) -> None:
    """A calibration file as `lab calibrate` writes it, with these host rates (MB/s per CPU s);
    `size`: the datagrams the stand-ins were measured with, where not the default."""
    from lab.model.cpucalibration import CALIBRATION_SCHEMA, host_cpu_model

    prof = load_cpu_profile("board", merge_calibration=False)
    cal.mkdir(exist_ok=True)
    (cal / "board.json").write_text(
        json.dumps(
            {
                "schema": CALIBRATION_SCHEMA,
                "profile_fingerprint": prof.fingerprint(),
                "host": {"cpu_model": host_cpu_model()},
                "core_share": 0.25,
                "measured": {p: {"best": {"cpu_mbps": r}} for p, r in rates.items()},
                "processes": {
                    k: {"host_mbps": v, **({"size": size} if size else {})}
                    for k, v in (standins or {}).items()
                },
            }
        )
    )


def esp(primitive="aes-128-gcm", board="kernel:xfrm-esp"):
    return DataPlaneCpu("charon", primitive, board)


@pytest.fixture
def plan_esp(board):
    """plan() of charon's ESP for a 4-core board node, as the board profile stands when called,
    calibrated just before: OpenSSL's AES-128-GCM at 400 MB/s per host CPU second, charon as a
    whole process at 50 (measured with `size`-byte datagrams where given)."""

    def plan(size: int | None = None) -> dict:
        calibrate(board[1], {"aes-128-gcm": 400.0}, {"charon:aes-128-gcm": 50.0}, size=size)
        return boardkernel.plan(load_cpu_profile("board"), esp(), cores=4)

    return plan


def test_kernel_stand_in_one_core_at_the_kernel_figure(plan_esp):
    # OpenSSL's primitive alone: 400 MB/s per host CPU second; charon as a whole process: 50
    rec = plan_esp()
    assert rec["groups"] == 1 and rec["threading"] == "one-core"
    # per byte here: 20 ns, of which 2.5 crypto; on the board: 1/20 MB/s = 50 ns of the kernel's
    # crypto + the other 17.5 ns at a board core's speed (/ core_share 0.25) = 70 ns
    assert rec["share"] == pytest.approx(20 / (50 + 17.5 / 0.25), rel=1e-4)
    assert rec["board_mbps_predicted"] == pytest.approx(1000 / 120, rel=1e-3)
    assert rec["crypto_fraction"] == pytest.approx(2.5 / 20)
    assert rec["basis"] == "process" and rec["board_reference"] == "kernel-gcm-aes-128"
    assert rec["implementation"].startswith("rfc4106") and rec["kernel"] == "5.10 armv7l"
    assert "why" not in rec


PATH = """
[kernel.dataplane.xfrm-esp.path]
bytes = 1400
source = "counted"
[kernel.dataplane.xfrm-esp.path.pps]
aes-128-gcm = 40000
"""


def test_board_kernel_path_replaces_the_stand_ins_path(board, plan_esp):
    (board[0] / "board.toml").write_text(PROFILE + PATH)
    rec = plan_esp()
    # per byte on the board: the kernel's AEAD, 1/20 MB/s = 50 ns, plus its path, one packet per
    # 1400 bytes at 40000 packets/s = 1/56 MB/s = 17.86 ns; the stand-in's 20 ns per byte here
    # stand for both (its own path, 17.5 ns, no longer priced)
    assert rec["share"] == pytest.approx(20 / (50 + 1000 / 56), rel=1e-4)
    assert rec["board_mbps_predicted"] == pytest.approx(1000 / (50 + 1000 / 56), rel=1e-3)
    assert rec["path"] == "board kernel" and rec["board_path_pps"] == 40000
    assert rec["board_path_bytes"] == 1400 and rec["board_path_source"] == "counted"
    # without the path table: the stand-in's own path at a board core's speed, as before
    (board[0] / "board.toml").write_text(PROFILE)
    old = plan_esp()
    assert old["path"] == "stand-in at core_share"
    assert old["share"] == pytest.approx(20 / (50 + 17.5 / 0.25), rel=1e-4)


def test_board_kernel_path_is_spread_over_the_stand_ins_datagrams(board, plan_esp):
    # the calibration measured the stand-in with 1300-byte datagrams: the path's per-packet
    # cost is spread over 1300 bytes, not the 1400 it was counted with
    (board[0] / "board.toml").write_text(PROFILE + PATH)
    rec = plan_esp(size=1300)
    assert rec["board_path_bytes"] == 1300
    assert rec["share"] == pytest.approx(20 / (50 + 1000 / 52), rel=1e-4)


def test_share_of_with_a_board_path():
    # a path that costs nothing: the board side is its crypto alone
    assert boardkernel.share_of(0.25, 60, 30, 240, 1e12)[0] == pytest.approx(60 / 30, rel=1e-6)
    # the same board time either way: the stand-in's path at core_share or the kernel's
    t, c = 1 / 30, 1 / 240
    same = 1 / ((t - c) / 0.25)
    assert boardkernel.share_of(0.25, 60, 30, 240, same)[0] == pytest.approx(
        boardkernel.share_of(0.25, 60, 30, 240)[0]
    )


def test_share_of_its_limits():
    # all crypto: the board's figure over the host's
    assert boardkernel.share_of(0.25, 60, 240, 240)[0] == pytest.approx(0.25)
    assert boardkernel.share_of(0.25, 60, None, 240) == (
        0.25,
        {"basis": "primitive", "crypto_fraction": 1.0},
    )
    # crypto negligible on both: the process is priced like any board work
    assert boardkernel.share_of(0.25, 1e9, 10, 1e9)[0] == pytest.approx(0.25, rel=1e-3)
    # no board figure: core_share
    assert boardkernel.share_of(0.25, None, 10, 100)[0] == 0.25


def test_userspace_single_thread_at_its_primitive(board):
    calibrate(board[1], {"aes-256-cbc": 240.0})
    dp = DataPlaneCpu("openvpn", "aes-256-cbc", "userspace", threads="one")
    rec = boardkernel.plan(load_cpu_profile("board"), dp, cores=4)
    # not measured as a process: taken as all crypto
    assert rec["groups"] == 1 and rec["share"] == pytest.approx(60 / 240)
    assert rec["vs_core_share"] == pytest.approx(1.0) and rec["basis"] == "primitive"


USERPATH = """
[userspace.dataplane.openvpn.path]
bytes = 1300
program = "OpenVPN 2.6"
source = "counted"
confidence = "low"
[userspace.dataplane.openvpn.path.pps]
aes-256-cbc = 10000
"""


def openvpn():
    return DataPlaneCpu("openvpn", "aes-256-cbc", "userspace", threads="one")


def test_userspace_path_replaces_the_process_path_at_core_share(board):
    (board[0] / "board.toml").write_text(PROFILE + USERPATH)
    # OpenSSL's AES-256-CBC here 240 MB/s per CPU s, openvpn as a whole process 40
    calibrate(board[1], {"aes-256-cbc": 240.0}, {"openvpn:aes-256-cbc": 40.0})
    rec = boardkernel.plan(load_cpu_profile("board"), openvpn(), cores=4)
    # per byte here 25 ns; on the board the cipher at 60 MB/s (16.67 ns) plus the counted path:
    # 10000 datagrams of 1300 bytes a second = 13 MB/s (76.92 ns)
    board_ns = 1000 / 60 + 1000 / 13
    assert rec["groups"] == 1 and rec["threading"] == "one-thread"
    assert rec["share"] == pytest.approx(25 / board_ns, rel=1e-4)
    assert rec["board_mbps_predicted"] == pytest.approx(1000 / board_ns, rel=1e-3)
    assert rec["path"] == "board userspace" and rec["board_path_pps"] == 10000
    assert rec["board_path_bytes"] == 1300 and rec["board_path_program"] == "OpenVPN 2.6"
    assert rec["basis"] == "process" and rec["board_reference"] == "aes-256-cbc"
    # without the table: the process's own non-cipher time (25 - 4.17 ns) at core_share
    (board[0] / "board.toml").write_text(PROFILE)
    old = boardkernel.plan(load_cpu_profile("board"), openvpn(), cores=4)
    assert old["path"] == "stand-in at core_share"
    assert old["share"] == pytest.approx(25 / (1000 / 60 + (25 - 1000 / 240) / 0.25), rel=1e-4)


def test_userspace_path_only_for_its_process_and_primitive(board):
    (board[0] / "board.toml").write_text(PROFILE + USERPATH)
    calibrate(
        board[1],
        {"aes-256-cbc": 240.0, "aes-128-gcm": 400.0},
        {"openvpn:aes-256-cbc": 40.0, "openvpn:aes-128-gcm": 50.0, "tincd:aes-256-cbc": 40.0},
    )
    prof = load_cpu_profile("board")
    gcm = DataPlaneCpu("openvpn", "aes-128-gcm", "userspace", threads="one")
    tinc = DataPlaneCpu("tincd", "aes-256-cbc", "userspace")
    for dp in (gcm, tinc):
        rec = boardkernel.plan(prof, dp, cores=4)
        assert rec["path"] == "stand-in at core_share" and "board_path_pps" not in rec


def test_per_cpu_kernel_data_plane_gets_every_core(board):
    calibrate(board[1], {"go-chacha20-poly1305": 1000.0})
    dp = DataPlaneCpu("wireguard-go", "go-chacha20-poly1305", "kernel:wireguard")
    rec = boardkernel.plan(load_cpu_profile("board"), dp, cores=4)
    assert rec["groups"] == 4 and rec["threading"] == "per-cpu"
    # no kernel figure named for it: one board core's share, and the record says why
    assert rec["basis"] == "core_share" and rec["share"] == 0.25 and "names no" in rec["why"]


def test_uncalibrated_falls_back_to_core_share_and_says_so(board):
    rec = boardkernel.plan(load_cpu_profile("board"), esp(), cores=4)
    assert rec["basis"] == "core_share" and rec["share"] == 0.25
    assert "not measured" in rec["why"]
    # the primitive's own rate never prices a stand-in
    calibrate(board[1], {"aes-128-gcm": 400.0})
    rec = boardkernel.plan(load_cpu_profile("board"), esp(), cores=4)
    assert rec["basis"] == "core_share" and "not measured as a process" in rec["why"]


def test_no_kernel_table_keeps_the_stand_ins_threads(board, tmp_path):
    (board[0] / "plain.toml").write_text(PROFILE.split("[kernel]")[0])
    rec = boardkernel.plan(load_cpu_profile("plain", merge_calibration=False), esp(), cores=4)
    assert rec["groups"] == 4 and "no [kernel.dataplane.xfrm-esp]" in rec["why"]


@pytest.mark.parametrize(
    "edit, field",
    [
        (
            ('threading = "one-core"', 'threading = "two-core"'),
            "kernel.dataplane.xfrm-esp.threading",
        ),
        (
            ('aes-128-gcm = "kernel-gcm-aes-128"', 'aes-128-gcm = "kernel-gcm-aes-256"'),
            "kernel.dataplane.xfrm-esp.crypto.aes-128-gcm",
        ),
        (
            ('aes-128-gcm = "kernel-gcm-aes-128"', 'rot13 = "kernel-gcm-aes-128"'),
            "kernel.dataplane.xfrm-esp.crypto.rot13",
        ),
        (('source = "esp4.c"', 'sauce = "esp4.c"'), "kernel.dataplane.xfrm-esp.sauce"),
        (('version = "5.10"', 'verzion = "5.10"'), "kernel.verzion"),
        (
            ("aes-128-gcm = 40000", "aes-256-gcm = 40000"),
            "kernel.dataplane.xfrm-esp.path.pps.aes-256-gcm",
        ),
        (
            ("aes-128-gcm = 40000", "aes-128-gcm = -1"),
            "kernel.dataplane.xfrm-esp.path.pps.aes-128-gcm",
        ),
        (
            ("aes-128-gcm = 40000", 'aes-128-gcm = "fast"'),
            "kernel.dataplane.xfrm-esp.path.pps.aes-128-gcm",
        ),
        (('source = "counted"', 'sorce = "counted"'), "kernel.dataplane.xfrm-esp.path.sorce"),
        (("bytes = 1400", "bytes = 0"), "kernel.dataplane.xfrm-esp.path.bytes"),
    ],
)
def test_bad_kernel_tables_are_refused_naming_the_field(board, edit, field):
    refused(board, PROFILE + PATH, edit, field)


def refused(board, text: str, edit: tuple[str, str], field: str) -> None:
    """The profile `text` with `edit` made (its first string must be there) is refused when it
    loads, the error naming the file and `field`."""
    assert edit[0] in text
    (board[0] / "bad.toml").write_text(text.replace(*edit))
    with pytest.raises(ConfigError) as e:
        load_cpu_profile("bad")
    assert e.value.field == field and "bad.toml" in str(e.value)


@pytest.mark.parametrize(
    "edit, field",
    [
        (("aes-256-cbc = 10000", "aes-128-cbc = 10000"), "userspace.dataplane.openvpn.path.pps.aes-128-cbc"),
        (("aes-256-cbc = 10000", "kernel-gcm-aes-128 = 10000"), "userspace.dataplane.openvpn.path.pps.kernel-gcm-aes-128"),
        (("aes-256-cbc = 10000", "aes-256-cbc = 0"), "userspace.dataplane.openvpn.path.pps.aes-256-cbc"),
        (("aes-256-cbc = 10000", "aes-256-cbc = true"), "userspace.dataplane.openvpn.path.pps.aes-256-cbc"),
        (('source = "counted"', 'source = ""'), "userspace.dataplane.openvpn.path.source"),
        (('program = "OpenVPN 2.6"', "program = 2.6"), "userspace.dataplane.openvpn.path.program"),
        (('confidence = "low"', 'confidence = "certain"'), "userspace.dataplane.openvpn.path.confidence"),
        (("bytes = 1300", "bytes = 1300.5"), "userspace.dataplane.openvpn.path.bytes"),
        (("bytes = 1300", "threading = 1"), "userspace.dataplane.openvpn.path.threading"),
        (("[userspace.dataplane.openvpn.path]", "[userspace.dataplane.openvpn.paths]"), "userspace.dataplane.openvpn.paths"),
        (("[userspace.dataplane.openvpn.path]", "[userspace.plane.openvpn.path]"), "userspace.plane"),
    ],
)  # fmt: skip
def test_bad_userspace_tables_are_refused_naming_the_field(board, edit, field):
    refused(board, PROFILE + USERPATH, edit, field)


@pytest.mark.parametrize(
    "proposals, prim",
    [
        ("aes128gcm8-prfsha256", "aes-128-gcm"),
        ("aes256gcm16-prfsha256-modp2048", "aes-256-gcm"),
        ("chacha20poly1305-prfsha256", "chacha20-poly1305"),
        ("aes256-sha256", "aes-256-cbc"),
        ("null-sha256", None),
    ],
)
def test_esp_primitive(proposals, prim):
    assert esp_primitive(proposals) == prim


def test_drivers_declare_their_data_plane():
    ss = StrongSwanDriver()
    params = {"esp_proposals": "aes128gcm8-prfsha256", "dataplane": "auto"}
    dp = ss.cpu_dataplane(params, "kernel-libipsec")
    assert (dp.daemon, dp.primitive, dp.board) == ("charon", "aes-128-gcm", "kernel:xfrm-esp")
    assert ss.cpu_dataplane(params, "kernel") is None  # the kernel carries it: nothing to hold
    assert ss.cpu_dataplane({**params, "dataplane": "libipsec"}, "kernel-libipsec").board == (
        "userspace"
    )
    wg = WireGuardDriver().cpu_dataplane({"implementation": "auto"}, "wireguard-go")
    assert (wg.daemon, wg.board) == ("wireguard-go", "kernel:wireguard")
    ov = OpenVPNDriver().cpu_dataplane({"cipher": "AES-256-CBC"}, "userspace")
    assert (ov.primitive, ov.threads) == ("aes-256-cbc", "one")


def _vpn(path="kernel-libipsec", client="a", server="b"):
    from lab.vpn.base import Availability

    return SimpleNamespace(
        availability=Availability(True, path),
        driver=StrongSwanDriver(),
        profile=SimpleNamespace(params={"esp_proposals": "aes128gcm8", "dataplane": "auto"}),
        client=SimpleNamespace(node=client),
        server=SimpleNamespace(node=server),
    )


def test_plan_annotates_only_capped_tunnel_ends(board):
    calibrate(board[1], {"aes-128-gcm": 400.0}, {"charon:aes-128-gcm": 400.0})
    capped = {"profile": "board", "cores": 1.0, "slots": 4, "dilation": 2.0}
    cpu = {
        "a": dict(capped),
        "b": {**capped, "not_applied": "TCG"},
        "r": dict(capped),  # not a tunnel end
    }
    assert dataplane_plan(cpu, _vpn(client="a", server="b")) == []
    assert cpu["a"]["dataplane"]["groups"] == 1
    # a group is one board core in the dilated experiment: the share / the dilation (all crypto
    # here: the board's figure over the host's)
    assert cpu["a"]["dataplane"]["group_cores"] == pytest.approx(20 / 400 / 2)
    assert "dataplane" not in cpu["b"] and "dataplane" not in cpu["r"]
    assert dataplane_plan(cpu, _vpn(path="kernel")) == []


def test_plan_without_core_groups_records_why(board):
    calibrate(board[1], {"aes-128-gcm": 400.0})
    cpu = {"a": {"profile": "board", "cores": 0.25, "slots": 0, "per_core_not_applied": "v2"}}
    dataplane_plan(cpu, _vpn(client="a", server="a"))
    assert cpu["a"]["dataplane"]["groups"] == 0 and cpu["a"]["dataplane"]["why"] == "v2"


# ------------------------------------------------------------------ calibration rows


def test_calibration_rows_give_each_data_plane_its_share_and_check_it(board):
    from lab.campaign import calibdataplane

    prof = load_cpu_profile("board", merge_calibration=False)
    asked = []

    def verify(prim, share):
        asked.append((prim, share))
        return {"aes-128-gcm": 19.0, "aes-256-cbc": 66.0}[prim]  # a capped group's delivery

    rows = calibdataplane.shares(
        prof,
        {"aes-128-gcm": 400.0, "aes-256-cbc": 240.0},
        verify=verify,
        processes={"charon:aes-128-gcm": {"host_mbps": 50.0}},
    )
    by = {(r["dataplane"], r["daemon"], r["primitive"]): r for r in rows}
    esp = by[("kernel xfrm-esp", "charon", "aes-128-gcm")]
    # priced as a process: OpenSSL's capped check does not apply
    assert esp["board_reference"] == "kernel-gcm-aes-128" and esp["basis"] == "process"
    assert esp["share"] == pytest.approx(20 / (50 + 17.5 / 0.25), rel=1e-4)
    assert "residual" not in esp
    cbc = by[("userspace", "openvpn", "aes-256-cbc")]
    assert cbc["share"] == pytest.approx(0.25) and cbc["residual"] == pytest.approx(0.1)
    # kernel-only references are not a userspace data plane's primitive
    assert not any(r["primitive"].startswith("kernel-") for r in rows)


def test_calibration_row_of_a_userspace_data_plane_uses_its_board_path(board):
    from lab.campaign import calibdataplane

    (board[0] / "board.toml").write_text(PROFILE + USERPATH)
    prof = load_cpu_profile("board", merge_calibration=False)
    rows = calibdataplane.shares(
        prof,
        {"aes-256-cbc": 240.0},
        processes={"openvpn:aes-256-cbc": {"host_mbps": 40.0, "size": 1000}},
    )
    cbc = next(r for r in rows if r["daemon"] == "openvpn")
    # the path spread over the calibration's 1000-byte datagrams: 10 MB/s, 100 ns a byte
    assert cbc["path"] == "board userspace" and cbc["board_path_mbps"] == pytest.approx(10)
    assert cbc["share"] == pytest.approx(25 / (1000 / 60 + 100), rel=1e-4)
    # and what plan() gives a node from the same figures
    calibrate(board[1], {"aes-256-cbc": 240.0}, {"openvpn:aes-256-cbc": 40.0}, size=1000)
    rec = boardkernel.plan(load_cpu_profile("board"), openvpn(), cores=4)
    assert rec["share"] == pytest.approx(cbc["share"], rel=1e-4)


# ------------------------------------------------------------------ on this machine


@pytest.mark.root
def test_data_plane_runs_in_its_own_groups(lab_id):
    """charon's kernel-libipsec run as the board would run it (dataplane=libipsec): every thread
    of it in the data plane's groups (four: the program's own threads, spread), each capped at
    the share, none on the node's board cores; the tunnel carries packets; teardown removes the
    groups."""
    from lab.core import cgroups
    from lab.core.teardown import teardown
    from lab.model.topology import load_topology
    from lab.substrate.local.build import up

    from .conftest import TOPOS, kernel_quota_cores

    layout = cgroups.probe()
    if cgroups.slots_supported(layout):
        pytest.skip(f"per-core groups unavailable: {cgroups.slots_supported(layout)}")
    lab = up(load_topology(TOPOS / "pi_pair.py"), lab_id, vpn="ipsec-aes128gcm:dataplane=libipsec")
    groups: list[str] = []
    try:
        cpu = lab.info["nodes"]["client"]["cpu"]
        dp = cpu["dataplane"]
        groups = lab.runtime["client"].dp_slots
        assert dp["daemon"] == "charon" and dp["board"] == "userspace"
        # dataplane=libipsec: the board runs kernel-libipsec too: its program's threads, spread
        assert dp["groups"] == 4 == len(groups)
        rel = lab.runtime["client"].cgroup
        assert kernel_quota_cores(lab.cg, f"{rel}/dp0") == pytest.approx(
            dp["group_cores"], abs=0.01
        )
        charon = [
            e["pid"]
            for e in lab.ledger.entries()
            if e["kind"] == "process" and e.get("name") == "charon" and e.get("node") == "client"
        ]
        assert charon
        tids = {int(t.name) for t in Path(f"/proc/{charon[-1]}/task").iterdir()}
        in_dp = {t for g in groups for t in cgroups.thread_ids(g)}
        assert tids <= in_dp, "every charon thread sits in a data plane group"
        assert not tids & {
            t for s in lab.runtime["client"].cpu_slots for t in cgroups.thread_ids(s)
        }
        target = lab.info["vpn"]["tunnel"]["server"]["v4"].split("/")[0]
        r = lab.node("client").run(["ping", "-c", "3", "-i", "0.2", "-W", "2", target], check=False)
        assert r.returncode == 0, r.stdout
    finally:
        left = teardown(lab_id)
    assert left == []
    assert not any(Path(g).exists() for g in groups)


@pytest.mark.root
def test_a_stand_in_is_measured_as_a_whole_process_and_its_lab_removed():
    """lab calibrate's stand-in run: a real charon kernel-libipsec tunnel, the CPU of both
    daemons against the bytes each handled (read from / written to its TUN, the kernel's
    counters); the stand-in costs more per byte than its cipher alone (TUN, sockets, threads),
    and the throwaway lab is gone afterwards."""
    from lab.campaign import calibstandin
    from lab.core.state import list_lab_ids

    prof = load_cpu_profile("pi4", merge_calibration=False)
    daemon = "charon"
    vpn = calibstandin.PROCESSES[(daemon, "chacha20-poly1305")]
    before = set(list_lab_ids())
    rec = calibstandin.measure(vpn, daemon, prof.env, seconds=2)
    assert set(rec["cpu_s"]) == {"client", "server"} and all(c > 0 for c in rec["cpu_s"].values())
    assert rec["host_mbps"] == min(rec["mbps_per_cpu_s"].values()) > 0
    assert rec["basis"] == {"client": "handled", "server": "handled"}, rec
    # the server wrote no more than the client read, and the receiver got no more than that
    assert rec["handled_mb"]["client"] >= rec["handled_mb"]["server"] >= rec["delivered_mb"] > 0
    assert set(list_lab_ids()) == before


def test_the_node_quota_prices_its_data_plane_cores_at_the_data_plane_share(board):
    """A node whose board spends one core on ESP: that core costs the data plane's share here,
    the other three core_share each, so the node's quota grows by the difference; a data plane
    cheaper than a core leaves the quota as it was; the nodes past this host's CPUs: a warning
    naming the factor."""
    from lab.substrate.local.dataplane import host_overcommit, raise_node_quota

    def four_cores():  # a node's CPU plan: four board cores of 0.25 host cores each
        return {"cores": 1.0, "slots": 4, "slot_cores": 0.25}

    p = four_cores()
    rec = {"groups": 1, "group_cores": 0.7}
    raise_node_quota(p, rec)
    assert p["cores"] == pytest.approx(1.45)
    assert rec["node_cores_before"] == 1.0 and rec["node_cores_added"] == pytest.approx(0.45)
    cheap = four_cores()
    raise_node_quota(cheap, {"groups": 1, "group_cores": 0.1})
    assert cheap["cores"] == 1.0
    per_cpu = four_cores()
    raise_node_quota(per_cpu, {"groups": 4, "group_cores": 0.45})
    assert per_cpu["cores"] == pytest.approx(1.8)
    cpu = {"a": p, "b": dict(p), "r": {"cores": None}, "t": {"cores": 3.0, "not_applied": "TCG"}}
    words = host_overcommit(cpu, host_cores=2)
    assert "2.90 of 2 host cores" in words and "dilation=1.5" in words
    assert host_overcommit(cpu, host_cores=4) is None
