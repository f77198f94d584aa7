"""The one small interface every VPN driver implements, and the context it works in.

A driver knows one technology (WireGuard, strongSwan, OpenVPN, ...). A profile (vpn_profiles/*.toml)
picks a driver and its parameters. The lab calls, in order:
    check_topology() -> does the technology fit this topology (pure; ConfigError if not)
    check(params, node) -> can this run on that node, and which data-plane path would it use
               there (before anything starts; read-only; asked through the node only)
    secrets() -> fresh per-lab keys/PSKs/certs, written mode 0600 into ctx.secrets_dir
    render() -> the config files per node, exactly as they would be deployed on a board
    start()  -> write the rendered files, start daemons with node.spawn (PIDs go to the ledger)
    (the lab then polls until traffic really passes the tunnel: lab.vpn.tunnel.wait_ready)
    describe() -> implementation, version, data-plane path, cipher, tunnel MTU, config hash
    stop()   -> stop what start() started (teardown also ends every recorded PID on its own)
and, for the `handshake` test's forced rekey (docs/measurements.md), rekey_support() says whether
and how a profile's keys can be renewed on demand, trigger_rekey() does it on a running tunnel;
key_exchange() gives that test a separate key exchange's cost (Rosenpass's).
Drivers run commands only through a lab.core.node.Node (ctx.client.node, ctx.server.node, the node
check() is given), never on the host directly and never by reading the controller's files about a
node (its /proc, /sys, /dev, kernel config or installed files), so the same driver later drives
Raspberry Pi boards over SSH and labs inside a VM. Before any lab node exists, check() is given
lab.substrate.local.node.this_machine(): the machine whose namespaces will be the lab's nodes.

Each driver also declares the executables it may run on a node (`requires`: lab.core.tools.Tool =
name, Debian package, version command, whether an arch node runs the board's build) and any
other Debian package it needs (`packages`: plug-ins, libraries). That one declaration feeds
setup.sh's package list, `lab arch fetch`, the arch nodes' tool map, the board checks and the
run manifest's tool versions (lab.substrate.tools gathers it; tests/test_vpn_conformance.py
checks the lists are derived from it).
"""

from __future__ import annotations

from lab import REPO
import hashlib
import os
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from collections.abc import Callable, Iterable

import jinja2

from lab.core.errors import PreconditionError
from lab.core.node import Daemon, Node
from lab.core.tools import Tool
from lab.model.boardkernel import DataPlaneCpu
from lab.model.params import Param
from lab.core.state import write_text_atomic


@dataclass
class Endpoint:
    """One tunnel end: a node, its underlay address(es) and its tunnel address(es)."""

    name: str  # node name
    node: Node
    underlay_v4: str  # address the peer reaches this end at, e.g. "10.0.1.2"
    underlay_v6: str | None
    tunnel_v4: str  # e.g. "10.99.0.1/24"
    tunnel_v6: str  # e.g. "fd99::1/64"
    # networks behind this end that the other end routes through the tunnel (site-to-site)
    behind: list[str] = field(default_factory=list)
    underlay_if: str | None = None  # this end's interface facing the peer


@dataclass
class TunnelContext:
    lab_id: str
    client: Endpoint  # initiator
    server: Endpoint  # responder
    secrets_dir: Path  # mode 0700; every file in it 0600; never copied into results
    config_dir: Path  # rendered configs, one sub-directory per node
    log_dir: Path
    daemons: list[Daemon] = field(default_factory=list)
    profile: str = ""  # the profile's name, for headers of rendered files
    #: the data-plane path check() found on the nodes ("" when nobody asked: then a driver
    #: that renders per path goes by its parameters)
    dataplane: str = ""
    #: role -> the user's own config file (lab.vpn.userconfig.UserConfig) when the profile
    #: carries them ([configs]); empty: the driver renders its own templates
    configs: dict = field(default_factory=dict)

    def ends(self) -> tuple[Endpoint, Endpoint]:
        return self.client, self.server

    def peer(self, end: Endpoint) -> Endpoint:
        return self.server if end is self.client else self.client

    def write_config(self, end: Endpoint, files: dict[str, str]) -> dict[str, Path]:
        """Write one node's rendered files under config_dir/<node>/ (0600: they may hold keys)."""
        out = {}
        for rel, text in files.items():
            path = self.config_dir / end.name / rel
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_text_atomic(path, text, mode=0o600)
            out[rel] = path
        return out


@dataclass
class Availability:
    ok: bool
    path: (
        str  # data-plane path that would be used, e.g. "kernel", "wireguard-go", "kernel-libipsec"
    )
    why: str = ""  # when not ok: what is missing (and e.g. "use --vm")


@dataclass(frozen=True)
class Rekey:
    """Whether a profile's session keys can be renewed on demand (`ok`), and how -- or, when
    not, why not (`how`: one sentence a plan error or a report quotes)."""

    ok: bool
    how: str


class Driver(ABC):
    name: str = ""
    #: False for the baseline: no tunnel, traffic goes to the peer's underlay address
    has_tunnel: bool = True
    params: ClassVar[dict[str, Param]] = {}
    #: keys of rendered-config values that are secret (redacted unless asked)
    secret_markers: tuple[str, ...] = ()
    #: every executable the driver may run on a node besides lab.core.tools.NODE_TOOLS (its
    #: daemons, its tools, its probes): package and version command of each
    requires: ClassVar[tuple[Tool, ...]] = ()
    #: Debian packages the driver needs besides its tools' (plug-ins and libraries its daemons
    #: load): setup.sh installs them and `lab arch fetch` ships them with the board's tools
    packages: ClassVar[tuple[str, ...]] = ()

    def tools(self, params: dict) -> list[str]:
        """Executables this profile needs on the node (checked before anything starts); a
        subset of `requires` (default: all of them)."""
        return [t.name for t in self.requires]

    def validate(self, params: dict, *, source: str) -> None:
        """Checks across parameters (each one alone is already valid); raise ConfigError."""
        return None

    def check_topology(self, spec, plan) -> None:
        """Does the technology fit the topology (e.g. layer 2 needs both ends on one segment)?
        Pure, called before anything exists; raise ConfigError naming what would work."""
        return None

    @abstractmethod
    def check(self, params: dict, node: Node) -> Availability:
        """Can it run on `node` (a lab node, or this_machine() before the lab exists), and which
        data-plane path would it use there? Asks the node only (node.run, kernelfeatures);
        must not change anything."""

    def cpu_dataplane(self, params: dict, path: str) -> DataPlaneCpu | None:
        """The process that carries this profile's packets on a node when check() chose `path`,
        and what the board would run instead (lab.model.boardkernel: a board profile holds it to
        the board's threading and crypto speed). None: no such process here (a kernel data
        plane, no tunnel)."""
        return None

    def secrets(self, ctx: TunnelContext, params: dict) -> dict[str, str]:
        """Generate fresh secrets (write them 0600 under ctx.secrets_dir); returns name -> value."""
        return {}

    @abstractmethod
    def render(
        self, ctx: TunnelContext, params: dict, secrets: dict[str, str]
    ) -> dict[str, dict[str, str]]:
        """{node name: {relative file path: content}} as deployed on a board."""

    @abstractmethod
    def start(self, ctx: TunnelContext, params: dict, rendered: dict[str, dict[str, str]]) -> None:
        """Bring the tunnel up (configs in ctx.config_dir/<node>/, daemons via node.spawn)."""

    @abstractmethod
    def describe(self, ctx: TunnelContext, params: dict) -> dict:
        """{implementation, version, path, cipher, mtu, config_hash, ...}."""

    def rekey_support(self, params: dict) -> Rekey:
        """Can the running tunnel of a profile with `params` be rekeyed on demand
        (trigger_rekey)? Pure: the plan asks before anything is built."""
        return Rekey(False, f"{self.name} has no key exchange that could be renewed")

    def trigger_rekey(self, ctx: TunnelContext, params: dict, *, timeout: float) -> dict:
        """Renew the running tunnel's keys now and wait (up to `timeout` s) until the new ones
        are in use. Returns the daemon's own evidence: {"how", "before", "after"} (e.g. the
        CHILD_SA's SPIs). StartupError when no new keys appear in time; PreconditionError for a
        profile whose rekey_support() says no."""
        raise PreconditionError(
            f"profile {ctx.profile!r} cannot be rekeyed on demand: {self.rekey_support(params).how}"
        )

    def key_exchange(self, ctx: TunnelContext, params: dict) -> dict | None:
        """A key exchange of its own beside the tunnel's handshake (Rosenpass's post-quantum one
        for WireGuard), as the last start() measured it: {"what", "ms", "bytes", "packets"}
        (the `handshake` test reports them). None: the driver has none."""
        return None

    def stop(self, ctx: TunnelContext, params: dict) -> None:
        for d in reversed(ctx.daemons):
            ctx.client.node.stop(d) if d.node == ctx.client.name else ctx.server.node.stop(d)


def config_hash(rendered: dict[str, dict[str, str]]) -> str:
    h = hashlib.sha256()
    for node in sorted(rendered):
        for path in sorted(rendered[node]):
            h.update(f"{node}/{path}\0".encode())
            h.update(rendered[node][path].encode())
    return h.hexdigest()[:16]


def write_secret(secrets_dir: Path, name: str, value: str) -> Path:
    """A secret file, mode 0600, in a mode-0700 directory."""
    secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    secrets_dir.chmod(0o700)
    path = secrets_dir / name
    write_text_atomic(path, value, mode=0o600)
    return path


def make_secrets(
    secrets_dir: Path, prefix: str, names: Iterable[str], make: Callable[[Path], None]
) -> dict[str, str]:
    """Key files a tool writes, kept as secrets: `make(scratch)` runs the tool into a private
    scratch directory under `secrets_dir` with umask 077 (no key is readable by others even
    while it is made); then each of `names` it wrote there goes into `secrets_dir` as
    `<prefix><name>` (write_secret: 0600), the scratch directory goes, and the files' text
    is returned by name."""
    secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    made: dict[str, str] = {}
    with tempfile.TemporaryDirectory(dir=secrets_dir) as tmp:
        scratch = Path(tmp)
        old = os.umask(0o077)
        try:
            make(scratch)
        finally:
            os.umask(old)
        for name in names:
            made[name] = (scratch / name).read_text()
    for name, text in made.items():
        write_secret(secrets_dir, prefix + name, text)
    return made


def route_through(end: Endpoint, peer: Endpoint, dev: str) -> None:
    """Send the networks behind `peer` through the tunnel device `dev` on `end`.

    `replace`, not `add`: the topology already routes them over the underlay, and that route
    must stop carrying them (otherwise traffic between the sites bypasses the tunnel).
    """
    for net in peer.behind:
        fam = "-6" if ":" in net else "-4"
        end.node.run(["ip", fam, "route", "replace", net, "dev", dev])


#: Jinja2 templates of the drivers' config files (vpn_profiles/templates/<driver>/...)
TEMPLATE_DIR = REPO / "vpn_profiles" / "templates"


def render_template(rel: str, **values: Any) -> str:
    """Render vpn_profiles/templates/<rel> (Jinja2; an undefined name is an error, not '')."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    return env.get_template(rel).render(**values)
