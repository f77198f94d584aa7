"""Nodes of another architecture (issue 19): the board's own arm64 binaries under qemu-user.

Unit tests: the fetch plan (apt with a private configuration, never the host's), which binary
runs a command (lab.core.arch.emulate.ArchRoot.wrap), bad input. The real `lab arch fetch arm64`
(root, Debian's mirror reachable) into a cache of its own. Integration tests (root, the arm64
root of `lab arch fetch arm64` and qemu-aarch64-static): WireGuard (wireguard-go), OpenVPN and
strongSwan (kernel-libipsec) between an arm64 node and an x86 one, arm64 ping and iperf3
through them, and OpenSSL's Pi 4 mask.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from lab.core import cgroups
from lab.core.arch import ARCHES, MANIFEST, get
from lab.core.arch import fetch as archfetch
from lab.core.arch.emulate import ArchRoot
from lab.core.errors import ConfigError, PreconditionError
from lab.substrate.tools import board_packages, board_tools, declarations
from tests.conftest import TOPOS, kernel_quota_cores, lab_traces, run_lab

ARM64 = ARCHES["arm64"]


# ---------------------------------------------------------------------------------- fetch plan
def test_fetch_plan_keeps_apt_private(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_ARCH_CACHE", str(tmp_path))
    p = archfetch.plan(ARM64, board_packages())
    assert p.root == tmp_path / "arm64"
    update, install = p.commands()
    assert update[0] == "apt-get" and update[-1] == "update"
    assert install[-len(p.packages) - 4 : -len(p.packages)] == [
        "install",
        "-y",
        "--download-only",
        "--no-install-recommends",
    ]
    for pkg in ("wireguard-go", "iperf3", "openvpn", "strongswan-charon", "openssh-server"):
        assert pkg in p.packages
    assert "libcharon-extra-plugins" in p.packages  # kernel-libipsec
    assert "libc-bin" in p.packages  # the root's ldconfig
    # plumbing runs as this machine's binary, so its package is not fetched (wg: wireguard-tools)
    assert "wireguard-tools" not in p.packages and "iproute2" not in p.packages
    opts = dict(
        update[i + 1].split("=", 1) for i, a in enumerate(update[:-1]) if a == "-o"
    )  # every -o KEY=VALUE
    assert opts["APT::Architecture"] == opts["APT::Architectures"] == "arm64"
    # every place apt reads its package state or writes anything is the lab's own
    for key in ("Dir::State", "Dir::State::status", "Dir::Cache", "Dir::Etc::SourceList"):
        assert opts[key].startswith(str(tmp_path / ".apt-arm64")), key
    assert all("dpkg" not in a for cmd in p.commands() for a in cmd)  # no --add-architecture
    src = p.sources_text()
    assert src.count("[arch=arm64 ") == 3 and " bookworm main" in src


def test_fetch_is_quick_when_the_root_has_it_all(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_ARCH_CACHE", str(tmp_path))
    p = archfetch.plan(ARM64, board_packages())
    p.root.mkdir()
    (p.root / MANIFEST).write_text(json.dumps({"arch": "arm64", "requested": list(p.packages)}))

    def no_commands(*a, **k):
        raise AssertionError(f"ran {a}")

    monkeypatch.setattr(archfetch.proc, "run", no_commands)
    assert archfetch.fetch(p)["already_present"] is True
    # one package more than the root holds: fetched again (here: the command it would run)
    more = archfetch.plan(ARM64, {**p.why, "tinc-extra": "a test"})
    assert archfetch.present(more) is None


def test_unknown_architecture_names_the_accepted_ones(tmp_path):
    with pytest.raises(
        ConfigError, match=r"--arch: unknown architecture 'sparc'; accepted: arm64, armhf"
    ):
        get("sparc")
    r = run_lab("arch", "fetch", "mips")
    assert r.returncode == 2 and "accepted: arm64, armhf" in r.stderr
    topo = tmp_path / "t.py"
    topo.write_text(
        "from mininet.topo import Topo\n"
        "class T(Topo):\n"
        "    def build(self):\n"
        "        a = self.addHost('a', arch='amd64')\n"
        "        self.addLink(a, self.addHost('b'))\n"
        "topos = {'t': T}\n"
    )
    from lab.model.topology import load_topology

    with pytest.raises(ConfigError) as ei:
        load_topology(topo)
    msg = str(ei.value)
    assert str(topo) in msg and "'a'" in msg and "arch" in msg and "amd64" in msg
    assert "arm64" in msg and "armhf" in msg  # the accepted values


# ---------------------------------------------------------------------------------- wrap
def _exe(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_wrap_runs_board_tools_from_the_root_under_qemu_and_the_rest_on_the_host(tmp_path):
    root = tmp_path / "arm64"
    _exe(root / "usr/bin/iperf3")
    _exe(root / "usr/bin/wg")
    _exe(root / "usr/lib/openvpn/openvpn")
    (root / "usr/sbin").mkdir(parents=True)
    # an absolute link is the board's path: resolved inside the root, never on this machine
    os.symlink("/usr/lib/openvpn/openvpn", root / "usr/sbin/openvpn")
    r = ArchRoot(ARM64, root, "/usr/bin/qemu-aarch64-static", board_tools())
    assert r.wrap(["iperf3", "-s"]) == [
        "/usr/bin/qemu-aarch64-static",
        "-L",
        str(root),
        "-0",
        "/usr/bin/iperf3",
        str(root / "usr/bin/iperf3"),
        "-s",
    ]
    assert r.wrap(["openvpn"])[4:6] == [
        "/usr/lib/openvpn/openvpn",
        str(root / "usr/lib/openvpn/openvpn"),
    ]
    # node plumbing is this machine's even where the root has it (wg: generic netlink)
    assert r.wrap(["wg", "show"]) == ["wg", "show"]
    assert r.wrap(["sh", "-c", "true"]) == ["sh", "-c", "true"]  # not in the root
    assert r.ran_by(["iperf3"]) == "arm64 (qemu-aarch64-static)"
    assert r.ran_by(["wg"]).endswith("(host)")
    # a board tool the root lacks is refused, not quietly run as this machine's build
    assert r.missing(["iperf3", "tincd", "sh", "wg"]) == ["tincd"]
    with pytest.raises(PreconditionError, match="has no tincd; run `lab arch fetch arm64`"):
        r.wrap(["tincd", "--version"])


def test_missing_root_refuses_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_ARCH_CACHE", str(tmp_path))
    with pytest.raises(PreconditionError, match=r"no arm64 root at .*`lab arch fetch arm64`"):
        ArchRoot.open("arm64", board_tools())


@pytest.mark.root
def test_lab_up_refuses_an_arm64_node_without_its_root(tmp_path, lab_id):
    r = run_lab(
        "up", TOPOS / "pi_pair.py", "--id", lab_id, "-p", "client_arch=arm64",
        env={"LAB_ARCH_CACHE": str(tmp_path)},
    )  # fmt: skip
    assert r.returncode == 3, r.stdout + r.stderr
    assert "lab arch fetch arm64" in r.stderr
    assert lab_traces(lab_id) == []  # refused before anything was created


#: the host's package configuration, which `lab arch fetch` must not write (docs/arch.md)
HOST_APT_FILES = ("/var/lib/dpkg/status", "/etc/apt/sources.list", "/etc/ld.so.cache")


def _digests(paths) -> dict[str, str | None]:
    out = {}
    for p in map(Path, paths):
        out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
    return out


def _elf_machine(path: Path) -> tuple[int, int]:
    """(ELF class, e_machine) of an executable: (2, 183) is 64-bit AArch64 (elf(5))."""
    head = path.read_bytes()[:20]
    assert head[:4] == b"\x7fELF", path
    return head[4], int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


@pytest.mark.root
def test_arch_fetch_arm64_for_real(tmp_path, monkeypatch):
    """`lab arch fetch arm64` as setup.sh --arch arm64 runs it, nothing faked, into a cache of
    its own (LAB_ARCH_CACHE): apt downloads Debian 12's arm64 packages, they are unpacked into
    a root whose manifest lists them; the root's AArch64 binaries run under qemu-user and print
    the versions the manifest recorded; the host's package configuration, its foreign
    architectures and the default cache are as before; a second fetch finds it all there."""
    for tool in ("apt-get", "dpkg-deb", ARM64.qemu):
        if not shutil.which(tool):
            pytest.skip(f"{tool} missing (./setup.sh installs it)")
    uri, suite = archfetch.SUITES[0]
    try:
        urllib.request.urlopen(f"{uri}/dists/{suite}/Release", timeout=15).close()
    except OSError as e:
        pytest.skip(f"{uri} unreachable ({e}): the fetch downloads Debian 12's arm64 packages")
    default_manifest = Path("/var/cache/lab/arch/arm64") / MANIFEST
    default_before = default_manifest.stat().st_mtime_ns if default_manifest.exists() else None
    host_before = _digests(HOST_APT_FILES)
    foreign_before = archfetch.foreign_architectures()
    cache = tmp_path / "arch"
    r = run_lab("arch", "fetch", "arm64", env={"LAB_ARCH_CACHE": str(cache)}, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    root = cache / "arm64"
    m = json.loads((root / MANIFEST).read_text())
    assert m["arch"] == "arm64" and m["requested"] == sorted(board_packages())
    pkgs = {p["package"]: p for p in m["packages"]}
    assert set(m["requested"]) <= set(pkgs)
    assert {p["arch"] for p in m["packages"]} <= {"arm64", "all"}
    assert "libc6" in pkgs  # apt resolved the closure against an empty dpkg status
    assert f"{len(pkgs)} packages unpacked into {root}" in r.stdout
    # every board tool is in the root, and each runs as an AArch64 binary under qemu-user
    monkeypatch.setenv("LAB_ARCH_CACHE", str(cache))
    arm = ArchRoot.open("arm64", board_tools())
    assert arm.missing(sorted({t.name for _, t in declarations() if t.board})) == []
    for tool, package, banner in (
        ("iperf3", "iperf3", "iperf "),
        ("openssl", "openssl", "OpenSSL "),
    ):
        assert _elf_machine(root / arm.find(tool).lstrip("/")) == (2, 183), tool
        upstream = pkgs[package]["version"].split(":")[-1].split("-")[0]  # 1:3.0.2-1 -> 3.0.2
        argv = [tool, "--version"] if tool == "iperf3" else [tool, "version"]
        cp = arm.run(argv)
        assert cp.returncode == 0 and cp.stdout.startswith(banner + upstream), (tool, cp.stdout)
    assert "aarch64" in arm.run(["iperf3", "--version"]).stdout  # uname() as qemu-user answers
    # the host: untouched
    assert _digests(HOST_APT_FILES) == host_before
    assert archfetch.foreign_architectures() == foreign_before
    assert m["host_foreign_architectures"] == {"before": foreign_before, "after": foreign_before}
    assert (default_manifest.stat().st_mtime_ns if default_manifest.exists() else None) == (
        default_before
    )
    # again: everything is there, nothing is downloaded
    again = run_lab("arch", "fetch", "arm64", env={"LAB_ARCH_CACHE": str(cache)}, timeout=120)
    assert again.returncode == 0 and "already holds" in again.stdout, again.stdout + again.stderr
    assert json.loads((root / MANIFEST).read_text()) == m


# ---------------------------------------------------------------------------------- emulated
def marker_on_the_wire(lab) -> tuple[bool, int]:
    """A UDP marker sent from the client to the server's tunnel address while the server's
    underlay interface is captured: (marker seen in the capture, capture size)."""
    marker = f"LABMARKER-{secrets.token_hex(8)}"
    pcap = lab.dir / "wire.pcap"
    send = (
        "import socket,sys,time\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "for _ in range(5):\n"
        "    s.sendto(sys.argv[2].encode(), (sys.argv[1], 9)); time.sleep(0.02)\n"
    )
    tcpdump = lab.node("server").popen(
        ["tcpdump", "-i", "server-eth0", "-n", "-U", "--immediate-mode", "-Z", "root",
         "-w", str(pcap)],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert b"listening on" in tcpdump.stderr.readline()
        lab.node("client").run([sys.executable, "-c", send, "10.99.0.2", marker])
        time.sleep(0.3)
    finally:
        tcpdump.terminate()
        tcpdump.wait(timeout=5)
    data = pcap.read_bytes()
    return marker.encode() in data, len(data)


@pytest.fixture(scope="module")
def arm64():
    """The arm64 root and qemu-aarch64-static, or skip naming which is missing."""
    try:
        return ArchRoot.open("arm64", board_tools())
    except PreconditionError as e:
        pytest.skip(str(e))


def test_openssl_mask_leaves_out_the_armv8_crypto_instructions(arm64, tmp_path):
    """OPENSSL_armcap=0x1 (a Pi 4: NEON, no ARMv8 crypto extensions) keeps the board's
    OpenSSL off AESE/SHA256H; QEMU's default CPU has them, so unmasked it uses them. Read from
    QEMU's log of the instructions it translated (-d in_asm)."""
    data = tmp_path / "data"
    data.write_bytes(os.urandom(4096))
    key = "00" * 16

    def count(env: dict, *args: str) -> dict[str, int]:
        log = tmp_path / "asm.log"
        log.unlink(missing_ok=True)
        argv = arm64.wrap(["openssl", *args])
        argv[1:1] = ["-d", "in_asm", "-D", str(log)]
        e = {k: v for k, v in os.environ.items() if not k.startswith("OPENSSL_")}
        subprocess.run(argv, env={**e, **env}, check=True, capture_output=True, timeout=60)
        text = log.read_text()
        return {i: len(re.findall(rf"\b{i}\b", text)) for i in ("aese", "sha256h")}

    enc = ["enc", "-aes-128-ctr", "-K", key, "-iv", key, "-in", str(data), "-out", os.devnull]
    dgst = ["dgst", "-sha256", str(data)]
    plain = {"aese": count({}, *enc)["aese"], "sha256h": count({}, *dgst)["sha256h"]}
    masked = {"aese": count(ARM64.env, *enc)["aese"], "sha256h": count(ARM64.env, *dgst)["sha256h"]}
    assert plain["aese"] > 0 and plain["sha256h"] > 0, plain  # the check can tell
    assert masked == {"aese": 0, "sha256h": 0}, masked


@pytest.mark.root
@pytest.mark.parametrize(
    "profile, daemon, server_arch",
    [
        ("wireguard:implementation=wireguard-go", "/usr/bin/wireguard-go", None),
        ("openvpn-aes256cbc-static", "/usr/sbin/openvpn", None),
        # charon with kernel-libipsec: IKE and ESP both in the board's charon
        ("ipsec-aes128gcm", "/usr/lib/ipsec/charon", None),
        # two boards' builds with each other
        ("wireguard:implementation=wireguard-go", "/usr/bin/wireguard-go", "arm64"),
    ],
)
def test_tunnel_from_an_arm64_node(arm64, lab_id, profile, daemon, server_arch):
    from lab.substrate.local.lab import Lab
    from lab.core.proc import is_same_process
    from lab.core.teardown import teardown

    r = run_lab(
        "up", TOPOS / "pi_pair.py", "--id", lab_id, "-p", "client_arch=arm64", "-p", "cpu=0.5",
        *(["-p", f"server_arch={server_arch}"] if server_arch else []), "--vpn", profile,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    lab = Lab.open(lab_id)
    daemons = {d["node"]: d for d in lab.info["vpn"]["daemons"]}
    try:
        ledger = [json.loads(x) for x in (lab.dir / "ledger.jsonl").read_text().splitlines()]
        procs = {x["node"]: x for x in ledger if x["kind"] == "process" and x.get("argv")}
        assert procs["client"]["arch"] == "arm64 (qemu-aarch64-static)"
        # the kernel's view: the client's daemon is QEMU running the root's build, in the
        # node's network namespace; an x86 server's is this machine's build
        cpid, spid = daemons["client"]["pid"], daemons["server"]["pid"]
        assert os.readlink(f"/proc/{cpid}/exe") == arm64.qemu
        cmdline = Path(f"/proc/{cpid}/cmdline").read_bytes().split(b"\0")
        assert str(arm64.root / daemon.lstrip("/")).encode() in cmdline
        if server_arch:
            assert procs["server"]["arch"] == "arm64 (qemu-aarch64-static)"
            assert os.readlink(f"/proc/{spid}/exe") == arm64.qemu
        else:
            assert "arch" not in procs["server"]  # a node of this machine's architecture
            assert os.readlink(f"/proc/{spid}/exe") != arm64.qemu
        node_ns = os.stat(f"/var/run/netns/{lab_id}-client").st_ino
        assert os.stat(f"/proc/{cpid}/ns/net").st_ino == node_ns
        environ = Path(f"/proc/{cpid}/environ").read_bytes().split(b"\0")
        assert b"OPENSSL_armcap=0x1" in environ and any(
            e.startswith(b"GODEBUG=cpu.aes=off") for e in environ
        )

        # no quota on an emulated node (cpu=0.5 caps the x86 one only); status says which
        layout = cgroups.probe()
        assert kernel_quota_cores(layout, lab.runtime["client"].cgroup) is None
        if not server_arch:
            assert kernel_quota_cores(layout, lab.runtime["server"].cgroup) == 0.5
        assert lab.status()["nodes"]["client"]["arch"] == "arm64"

        client, server = lab.node("client"), lab.node("server")
        for addr in ("10.99.0.2", "fd99::2"):  # the root's ping
            # replies through the tunnel prove it; one echo of three may be lost when an
            # emulated charon runs on a loaded machine (CI saw 1 of 2 lost once at load 10)
            out = client.run(["ping", "-c", "3", "-i", "0.2", "-W", "5", addr], check=False).stdout
            got = re.search(r"(\d+) received", out)
            assert got and int(got.group(1)) >= 2, out
        seen, size = marker_on_the_wire(lab)
        assert size > 200 and not seen  # packets captured, the plaintext marker not among them
        if profile != "wireguard:implementation=wireguard-go" or server_arch:
            return  # one transfer is enough to show the arm64 iperf3 (time budget)
        srv = server.spawn("iperf3", ["iperf3", "-s", "-1", "-B", "10.99.0.2"])
        try:
            for _ in range(100):  # until it listens
                ss = server.run(["ss", "-Hltn", "sport", "= :5201"]).stdout
                if ss.strip():
                    break
            cp = client.run(["iperf3", "-c", "10.99.0.2", "-t", "1", "-J"], timeout=30)
            res = json.loads(cp.stdout)
            # iperf3 reports the machine it runs on: the arm64 binary sees an aarch64 CPU
            assert res["start"]["system_info"].split()[-1] == "aarch64", res["start"]
            assert res["end"]["sum_received"]["bytes"] > 0
        finally:
            server.stop(srv)
    finally:
        d = run_lab("down", "--id", lab_id)
        assert d.returncode == 0, d.stdout + d.stderr
        assert teardown(lab_id) == []
    assert lab_traces(lab_id) == []
    for d in daemons.values():
        assert not is_same_process(d["pid"], d["start_time"]), d


# ---------------------------------------------------------------------------------- render --check
BYOC = Path(__file__).resolve().parent.parent / "docs/examples/byoc/openvpn"


def test_render_check_reads_the_configs_with_the_arm64_build(arm64, tmp_path):
    prof = tmp_path / "ovpn.toml"
    r = run_lab("profiles", "import", BYOC / "server.conf", BYOC / "client.ovpn", "--out", prof)
    assert r.returncode == 0, r.stderr
    wide = {"COLUMNS": "400"}  # one table row per line

    def check(vpn, out):
        return run_lab(
            "render", TOPOS / "pi_pair.py", "--vpn", vpn, "--out", tmp_path / out, "--check",
            "--arch", "arm64", env=wide,
        )  # fmt: skip

    ok = check(prof, "good")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    rows = [ln for ln in ok.stdout.splitlines() if "│ ok:" in ln]
    conf = [ln for ln in rows if "openvpn.conf" in ln]
    assert len(conf) == 2 and all(
        "arm64 (/usr/sbin/openvpn under qemu-aarch64-static)" in ln for ln in conf
    ), ok.stdout
    assert any("openssl x509 read it" in ln and "/usr/bin/openssl under" in ln for ln in rows)

    # a cipher the board's build lacks: the parser takes it, --show-ciphers does not list it
    tpl = next(tmp_path.glob("ovpn.client.*.j2"))
    good = tpl.read_text()
    tpl.write_text(good.replace("data-ciphers AES-256-GCM:AES-128-GCM", "data-ciphers AES-129-GCM"))
    bad = check(prof, "bad-cipher")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert str(prof) in bad.stderr and "client/openvpn.conf: data-ciphers AES-129-GCM" in bad.stderr
    assert "REFUSED" in bad.stdout


def test_render_check_gives_the_option_parsers_own_words(arm64, tmp_path):
    from lab.vpn.configcheck import check_rendered

    # a directive with a missing argument
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.conf").write_text("dev tun\nkeepalive 10\n")
    result = {"profile": {"driver": "openvpn"}, "files": {"a": {"x.conf": ""}}}
    (row,) = check_rendered(result, tmp_path, arm64)
    assert row.ok is False and row.detail.startswith("Options error"), row
    assert "x.conf:2: keepalive" in row.detail and "arm64" in row.checked_by


def test_render_check_lists_what_nothing_can_check(tmp_path):
    from lab.vpn.configcheck import check_rendered

    # nothing reads a WireGuard file offline: listed as not checked, never as passed
    result = {"profile": {"driver": "wireguard"}, "files": {"a": {"wg0.conf": ""}}}
    (row,) = check_rendered(result, tmp_path, None)
    assert (row.node, row.file, row.ok) == ("a", "wg0.conf", None) and "wg setconf" in row.detail


@pytest.mark.root
def test_an_arm64_tunnel_end_refuses_a_kernel_data_plane(arm64, lab_id):
    """Where the kernel has WireGuard (or ESP), `auto` would pick it: no board binary would run
    the tunnel, so an arm64 end refuses it before anything is created (this kernel lacks both:
    the plan says 'kernel' as such a machine's check would)."""
    from lab.substrate.local.build import up
    from lab.model.topology import load_topology
    from lab.vpn.base import Availability
    from lab.vpn.tunnel import plan

    spec = load_topology(TOPOS / "pi_pair.py", params={"client_arch": "arm64"})
    p = plan(spec, "wireguard")
    p.availability = Availability(True, "kernel")
    with pytest.raises(PreconditionError, match="'client' .arm64.*implementation=wireguard-go"):
        up(spec, lab_id, vpn=p)
    assert lab_traces(lab_id) == []


def test_the_root_has_its_own_ld_so_cache(arm64):
    """Made at fetch time by the root's ldconfig (chrooted): the board's ld.so finds its
    libraries from it, never from this machine's /etc/ld.so.cache."""
    cp = subprocess.run(
        [arm64.qemu, "-L", str(arm64.root), str(arm64.root / "sbin/ldconfig"), "-p"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cp.returncode == 0, cp.stderr
    assert "/lib/aarch64-linux-gnu/libc.so.6" in cp.stdout and "x86-64" not in cp.stdout


def test_board_tools_and_packages_come_from_the_declarations():
    declared = [t for _, t in declarations() if t.board]
    assert board_tools() == {t.basename for t in declared}
    assert {t.package for t in declared} <= set(board_packages())
    assert {"charon", "swanctl", "wireguard-go", "iperf3", "ping", "sshd"} <= board_tools()
    assert not {"wg", "ip", "ss", "sh", "tc"} & board_tools()  # plumbing: this machine's
