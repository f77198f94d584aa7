"""Every VPN driver honours the driver contract (issue 14, "drivers only through Node").

Parametrised over the registry (lab.vpn.driver_classes()), so a new driver module is checked without
touching this file. For each driver:
  - it implements lab.vpn.base.Driver (no abstract method left, the base's signatures, typed
    class declarations, check_topology declared by the base);
  - every tool a profile needs is declared (Driver.requires), and every version command is in
    the run manifest's tool list (preflight.TOOL_VERSIONS); its packages are checked in
    tests/test_packages.py;
  - its check() asks the node it is given and nothing else: run with recording fake nodes while
    reading /proc, /sys, /dev, /lib/modules, /etc or /usr/lib/ipsec of the machine running the
    tests, or running any command here, fails the test;
  - it has at least one profile in vpn_profiles/.
Plus the pieces the drivers stand on: the probes of lab.vpn.kernelfeatures and the Node helpers
(parsing pure, commands through the node), and the orchestrator (prepare, availability, render)
asking the nodes it is given, or this machine when there are none yet.
"""

from __future__ import annotations

import builtins
import inspect
import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lab.core import proc
from lab.campaign import setup as preflight
from lab.core.errors import KernelFeatureMissing, PreconditionError
from lab.model.topology import load_topology
from lab.vpn import declared_tools, driver_classes, kernelfeatures, tunnel
from lab.vpn.base import Availability, Driver
from lab.core.tools import NODE_TOOLS, Tool
from lab.model.params import Param
from lab.vpn.profiles import PROFILE_DIR, load_profile
from tests.conftest import REPO, TOPOS
from tests.fakenode import RecordingNode

DRIVERS = sorted(driver_classes())
VPN_DIR = REPO / "lab" / "vpn"
#: what a driver must never read on the machine running the controller
HOST_PATHS = ("/proc", "/sys", "/dev", "/lib/modules", "/etc", "/usr/lib/ipsec")
#: the Driver methods every driver has, with the base's parameters
CONTRACT = (
    "tools",
    "validate",
    "check_topology",
    "check",
    "secrets",
    "render",
    "start",
    "describe",
    "stop",
)


def profiles_of(driver: str) -> list:
    out = []
    for path in sorted(PROFILE_DIR.glob("*.toml")):
        prof = load_profile(str(path))
        if prof.driver_name == driver:
            out.append(prof)
    return out


def declared_names(driver: str) -> set[str]:
    return {t.name for t in driver_classes()[driver].requires} | {t.name for t in NODE_TOOLS}


# ------------------------------------------------------------------------ fake nodes


def _every_config_symbol() -> str:
    """A kernel config with every CONFIG_* symbol the driver modules name, =y."""
    syms = set()
    for f in VPN_DIR.rglob("*.py"):
        syms |= set(re.findall(r"\bCONFIG_[A-Z0-9_]*[A-Z0-9]\b", f.read_text()))
    return "".join(f"{s}=y\n" for s in sorted(syms))


FULL_CONFIG = _every_config_symbol()
PLUGINS = ("vici", "kernel-netlink", "socket-default", "openssl", "kdf", "kernel-libipsec")


def full_node() -> RecordingNode:
    """A node that has everything: every command works, every kernel symbol is there."""
    return RecordingNode(
        {
            ("gzip", "-dc", "/proc/config.gz"): (0, FULL_CONFIG, ""),
            ("ls", "-1", "/usr/lib/ipsec/plugins"): (
                0,
                "".join(f"libstrongswan-{p}.so\n" for p in PLUGINS),
                "",
            ),
            ("id", "-u"): (0, "0\n", ""),
            ("sh", "-c"): (0, "", ""),  # missing_tools: nothing missing
        },
        name="full",
        default=(0, "", ""),
    )


def bare_node() -> RecordingNode:
    """A node that has nothing: every command fails."""
    return RecordingNode(name="bare", default=(1, "", "Error: not here"))


@pytest.fixture
def no_host(monkeypatch):
    """Fail on any read of the controller's files about a node, and on any command run here."""

    def guard(fn, what):
        def wrapped(path, *a, **kw):
            p = path
            if isinstance(p, int):  # a file descriptor
                return fn(path, *a, **kw)
            p = os.fsdecode(os.fspath(p))
            if any(p == h or p.startswith(h + "/") for h in HOST_PATHS):
                raise AssertionError(f"{what}({p!r}) on the machine running the check")
            return fn(path, *a, **kw)

        return wrapped

    for mod, name in (
        (builtins, "open"),
        (io, "open"),
        (os, "open"),
        (os, "stat"),
        (os, "lstat"),
        (os, "listdir"),
        (os, "scandir"),
        (os, "access"),
    ):
        monkeypatch.setattr(mod, name, guard(getattr(mod, name), f"{mod.__name__}.{name}"))

    def no_command(*a, **kw):
        raise AssertionError(f"a command ran on the machine running the check: {a} {kw}")

    for mod, name in (
        (proc, "run"),
        (proc, "spawn"),
        (proc, "which"),
        (subprocess, "run"),
        (subprocess, "Popen"),
        (shutil, "which"),
    ):
        monkeypatch.setattr(mod, name, no_command)


def test_the_guard_catches_host_reads(no_host):
    with pytest.raises(AssertionError):
        Path("/proc/config.gz").read_bytes()
    with pytest.raises(AssertionError):
        os.path.isdir("/sys/module/esp4")
    with pytest.raises(AssertionError):
        Path("/dev/net/tun").exists()
    with pytest.raises(AssertionError):
        proc.run(["true"])


# ------------------------------------------------------------------------ the registry


def test_every_driver_module_registers_a_driver():
    modules = {p.stem for p in (VPN_DIR / "drivers").glob("*.py")} - {"__init__"}
    registered = {cls.__module__.rsplit(".", 1)[1] for cls in driver_classes().values()}
    assert modules == registered


@pytest.mark.parametrize("name", DRIVERS)
def test_implements_the_contract(name):
    cls = driver_classes()[name]
    assert issubclass(cls, Driver) and cls.name == name
    assert not inspect.isabstract(cls), f"{name}: abstract methods left: {cls.__abstractmethods__}"
    for meth in CONTRACT:
        base = list(inspect.signature(getattr(Driver, meth)).parameters)
        mine = list(inspect.signature(getattr(cls, meth)).parameters)
        assert mine == base, f"{name}.{meth}{mine} differs from Driver.{meth}{base}"
    assert isinstance(cls.has_tunnel, bool)
    assert isinstance(cls.params, dict)
    assert all(isinstance(k, str) and isinstance(p, Param) for k, p in cls.params.items())
    assert isinstance(cls.secret_markers, tuple)
    assert all(isinstance(m, str) for m in cls.secret_markers)
    assert isinstance(cls.requires, tuple) and cls.requires, f"{name} declares no tools"
    assert all(isinstance(t, Tool) for t in cls.requires)
    drv = cls()
    for prof in profiles_of(name):
        drv.validate(prof.params, source=str(prof.path))


def test_check_topology_is_declared_by_the_base():
    """A declared hook with a default, not an attribute looked up with getattr."""
    assert "check_topology" in Driver.__dict__
    assert _Minimal().check_topology(None, None) is None
    src = (VPN_DIR / "tunnel.py").read_text()
    assert 'getattr(drv, "check_topology"' not in src


class _Minimal(Driver):
    name = ""  # not registered

    def check(self, params, node):
        return Availability(True, "x")

    def render(self, ctx, params, secrets):
        return {}

    def start(self, ctx, params, rendered):
        pass

    def describe(self, ctx, params):
        return {}


@pytest.mark.parametrize("name", DRIVERS)
def test_has_a_profile(name):
    assert profiles_of(name), f"driver {name!r} has no profile in {PROFILE_DIR}"


# ------------------------------------------------------------------------ tools and packages


@pytest.mark.parametrize("name", DRIVERS)
def test_every_tool_a_profile_needs_is_declared(name):
    drv = driver_classes()[name]()
    declared = {t.name for t in drv.requires}
    for prof in profiles_of(name):
        undeclared = set(drv.tools(prof.params)) - declared
        assert not undeclared, f"profile {prof.name} needs undeclared {sorted(undeclared)}"


@pytest.mark.parametrize("name", DRIVERS)
def test_version_commands_are_in_the_manifest(name):
    for t in driver_classes()[name].requires:
        if t.version:
            assert preflight.TOOL_VERSIONS.get(t.key) == list(t.version), (name, t)


def test_manifest_records_the_daemons_of_every_technology():
    for key in ("tincd", "xl2tpd", "pppd", "wpa_supplicant", "openvpn", "charon", "wg"):
        assert key in preflight.TOOL_VERSIONS
    assert preflight.TOOL_VERSIONS["iperf3"] == ["iperf3", "--version"]  # measurement tools stay
    keys = [t.key for t in declared_tools() if t.version]
    assert set(keys) <= set(preflight.TOOL_VERSIONS)


# ------------------------------------------------------------------------ check() asks the node


def _cases():
    return [(n, p.name) for n in DRIVERS for p in profiles_of(n)]


def _inner_command(argv: list[str]) -> str:
    """The command a wrapper runs (`unshare --net ip ...` -> ip)."""
    rest = argv[1:]
    while rest and rest[0].startswith("-"):
        rest = rest[1:]
    return rest[0] if rest else ""


@pytest.mark.parametrize(("name", "profile"), _cases())
@pytest.mark.parametrize("make", [full_node, bare_node], ids=["has-all", "has-nothing"])
def test_check_asks_only_the_node(name, profile, make, no_host):
    prof = load_profile(profile)
    node = make()
    avail = prof.driver.check(prof.params, node)
    assert isinstance(avail, Availability)
    assert isinstance(avail.ok, bool) and isinstance(avail.path, str)
    assert isinstance(avail.why, str)
    if make is full_node:
        assert avail.ok, f"{profile} cannot run on a node that has everything: {avail.why}"
    elif not avail.ok:
        assert node.calls, f"{profile}: refused without asking the node"
        assert avail.why
    declared = declared_names(name)
    for argv in node.calls:
        assert argv[0] in declared, f"{profile}: check ran undeclared {argv[0]!r}: {argv}"
        if argv[0] == "unshare":
            assert _inner_command(argv) in declared, argv


# ------------------------------------------------------------------------ kernelfeatures


def test_parse_kernel_config_and_module_lists():
    cfg = kernelfeatures.parse_kernel_config("# c\nCONFIG_A=y\nCONFIG_B=m\n# CONFIG_C is not set\n")
    assert cfg == {"CONFIG_A": "y", "CONFIG_B": "m"}
    mods = kernelfeatures.parse_module_list(
        "kernel/net/ipv4/ip_gre.ko: kernel/net/ipv4/gre.ko\n"
        "kernel/net/l2tp/l2tp-eth.ko.xz:\nkernel/crypto/gcm.ko\n"
    )
    assert mods == {"ip_gre", "l2tp_eth", "gcm"}
    facts = kernelfeatures.KernelFacts(None, frozenset({"esp4"}), frozenset({"ah4"}))
    assert facts.has(("CONFIG_INET_ESP",), ("esp4",)) and facts.has(("X",), ("ah4",))
    assert not facts.has(("CONFIG_INET_ESP",), ("esp6",))


def test_kernel_facts_come_from_the_node(no_host):
    node = RecordingNode({("gzip", "-dc", "/proc/config.gz"): (0, "CONFIG_PPP=m\n", "")})
    features = [("PPP", ("CONFIG_PPP",), ("ppp_generic",)), ("L2TP", ("CONFIG_PPPOL2TP",), ())]
    assert [f[0] for f in kernelfeatures.missing_features(node, features)] == ["L2TP"]
    kernelfeatures.missing_features(node, features)
    assert node.calls == [["gzip", "-dc", "/proc/config.gz"]]  # asked once per node


def test_kernel_facts_without_config_use_loaded_and_listed_modules(no_host):
    node = RecordingNode(
        {
            ("ls", "-1", "/sys/module"): (0, "esp4\nipv6\n", ""),
            ("uname", "-r"): (0, "6.1.0-1\n", ""),
            ("cat", "/lib/modules/6.1.0-1/modules.builtin"): (0, "kernel/crypto/gcm.ko\n", ""),
        }
    )
    facts = kernelfeatures.kernel_facts(node)
    assert facts.config is None and facts.loaded == {"esp4", "ipv6"}
    assert facts.available == {"gcm"}
    assert [c[0] for c in node.calls] == ["gzip", "ls", "uname", "cat", "cat"]


def test_netns_probe_runs_on_the_node_and_maps_root_when_not_root(no_host):
    node = RecordingNode({("id", "-u"): (0, "1000\n", ""), ("unshare",): (1, "", "x\nno such\n")})
    assert kernelfeatures.probe_links(node, ("link add p type gre",)) == (False, "no such")
    assert node.calls[-1] == ["unshare", "--map-root-user", "--net", "ip", "-batch", "-"]
    assert node.inputs[-1] == "link add p type gre\n"
    root = RecordingNode({("id", "-u"): (0, "0\n", ""), ("unshare",): (127, "", "")})
    ok, why = kernelfeatures.probe_netns(root, ["ip", "link", "add", "w", "type", "wireguard"])
    assert not ok and "unshare/ip missing" in why
    assert root.calls[-1][:2] == ["unshare", "--net"]


# ------------------------------------------------------------------------ Node helpers


def test_node_helpers_ask_the_node(no_host):
    stat = "4242 (pppd) S 1 4242 4242 0 -1 4194560 " + " ".join(["0"] * 12) + " 777 0 0\n"
    node = RecordingNode(
        {
            ("sh", "-c"): (0, "wireguard-go\n", ""),
            ("cat", "/proc/100/task/100/children"): (0, "4242 4243\n", ""),
            ("cat", "/proc/4242/stat"): (0, stat, ""),
        }
    )
    assert node.missing_tools(["wg", "wireguard-go"]) == ["wireguard-go"]
    assert node.calls[0][:2] == ["sh", "-c"] and node.calls[0][-2:] == ["wg", "wireguard-go"]
    assert node.children(100) == [4242, 4243]
    d = node.adopt("pppd", 4242)
    assert (d.node, d.name, d.pid, d.start_time) == ("fake", "pppd", 4242, 777)
    assert node.adopt("pppd", 9).start_time is None  # gone: no answer
    assert node.private_mounts() is False  # unless a kind of node knows better


def test_parse_start_time():
    assert proc.parse_start_time(b"1 (a b) c) S " + b"0 " * 18 + b"55 0") == 55
    assert proc.parse_start_time("9 (x) Z " + "0 " * 18 + "55") is None  # zombie
    assert proc.parse_start_time("") is None


def test_l2tp_refuses_to_mount_on_a_node_without_private_mounts(no_host):
    from lab.vpn.base import Endpoint
    from lab.vpn.drivers.l2tp import _mount_ppp_dir

    node = RecordingNode(default=(0, "", ""))
    end = Endpoint("client", node, "10.0.1.2", None, "10.99.0.1/24", "fd99::1/64")
    with pytest.raises(PreconditionError, match="no mount namespace of its own"):
        _mount_ppp_dir(end, Path("/var/lib/lab/x/config/vpn/client/ppp"))
    assert node.calls == []  # refused before anything ran


def test_local_nodes_have_private_mounts_the_host_has_not():
    from lab.core.hostnode import HostNode, this_machine
    from lab.substrate.local.node import LocalNode

    n = LocalNode(
        "x", "client", netns="x-client", mntns=Path("/run/lab/x/ns/client"), procs_files=[]
    )
    assert n.private_mounts()
    assert not LocalNode("x", "s", netns="x-s", mntns=None, procs_files=[]).private_mounts()
    assert isinstance(this_machine(), HostNode) and this_machine() is this_machine()
    assert not this_machine().private_mounts()
    with pytest.raises(PreconditionError, match="probes only"):
        this_machine().spawn("x", ["true"])


# ------------------------------------------------------------------------ the orchestrator


def spec_of(name: str):
    return load_topology(TOPOS / f"{name}.py", params={"cpu": None})


def test_prepare_asks_the_nodes_it_is_given(no_host):
    spec = spec_of("pi_pair_middlebox")
    client, server = full_node(), full_node()
    p = tunnel.prepare(spec, "wireguard", nodes={"client": client, "server": server})
    assert p.availability.ok and p.availability.path == "kernel"
    for n in (client, server):
        assert any(c[:2] == ["sh", "-c"] for c in n.calls)  # tools
        assert any(c[0] == "unshare" for c in n.calls)  # the kernel probe
    ctx = tunnel.make_context("t", p, {}, Path("/nonexistent"))
    assert ctx.dataplane == "kernel"


def test_prepare_names_the_end_that_lacks_a_tool(no_host):
    spec = spec_of("pi_pair_middlebox")
    lacking = RecordingNode({("sh", "-c"): (0, "wg\n", "")}, name="server", default=(0, "", ""))
    with pytest.raises(PreconditionError, match="wg on server"):
        tunnel.prepare(spec, "wireguard", nodes={"client": full_node(), "server": lacking})


def test_ends_on_different_data_planes_are_refused(no_host):
    spec = spec_of("pi_pair_middlebox")
    userspace = RecordingNode(
        {("unshare",): (1, "", "Error: Unknown device type.\n"), ("sh", "-c"): (0, "", "")},
        default=(0, "", ""),
    )
    a = tunnel.check_on(
        load_profile("wireguard").driver,
        load_profile("wireguard").params,
        {"client": full_node(), "server": userspace},
    )
    assert not a.ok and "client: kernel" in a.why and "server: wireguard-go" in a.why
    with pytest.raises(KernelFeatureMissing):
        tunnel.prepare(spec, "wireguard", nodes={"client": full_node(), "server": userspace})


def test_without_a_lab_this_machine_answers(monkeypatch, no_host):
    """`lab profiles`, `lab render` and the preflight of `lab up`/`lab run` ask the node for
    this machine (one node for both ends: asked once)."""
    here = full_node()
    monkeypatch.setattr(tunnel, "this_machine", lambda: here)
    prof = load_profile("ipsec-aes128gcm")
    assert tunnel.availability(prof) == {"ok": True, "path": "kernel", "why": ""}
    assert sum(c[:2] == ["ls", "-1"] for c in here.calls) == 1
    here.calls.clear()
    spec = spec_of("pi_pair_middlebox")
    assert tunnel.prepare(spec, prof).availability.path == "kernel"
    assert here.calls
    here.calls.clear()


def test_render_uses_the_path_this_machine_would_run(monkeypatch):
    """strongSwan renders its data plane: `lab render` asks this machine for it."""
    import lab.vpn.drivers.strongswan as sw

    spec = spec_of("pi_pair_middlebox")
    for node, want in ((full_node(), "kernel"), (_no_esp_node(), "kernel-libipsec")):
        monkeypatch.setattr(tunnel, "this_machine", lambda node=node: node)
        conf = tunnel.render(spec, "ipsec-aes128gcm")["files"]["client"]["strongswan.conf"]
        assert sw.dataplane_of(conf) == want


def _no_esp_node() -> RecordingNode:
    n = full_node()
    n.answers[("gzip", "-dc", "/proc/config.gz")] = (0, "CONFIG_XFRM=y\n", "")
    return n
