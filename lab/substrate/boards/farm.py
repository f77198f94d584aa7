"""An emulated board farm: one node per board of a topology, each running a real sshd.

`lab boards emulate TOPOLOGY --out farm.toml` builds, as a lab of its own (same ledger, same
teardown):
- one node per host of the topology (same name, same CPU profile: its cgroup share and its
  crypto masks, which sshd passes to every command), cabled as the topology's links say at
  their bandwidth (the farm's tbf stands for the cable's line rate), its data interfaces named eth1, eth2, ... and left unaddressed, forwarding off: a
  freshly installed board;
- a management network: every board's eth0 on a switch with an address in a free
  172.30.X.0/24, and this machine reaching that switch through one veth (the only object the
  farm puts in the root namespace; it goes with the switch's namespace). SSH listens on the
  management address only, as on a board whose data ports carry the experiment;
- per board, its own /var/lib/lab (a tmpfs in the board's mount namespace, so files the
  controller puts on a board really travel over SSH), its own empty home directory for the
  login user (a tmpfs over root's: a fresh board has none of this machine's dotfiles, whose
  shell start-up - here pyenv's - would run at every SSH login and put its shims before
  /usr/bin/python3) and its sshd's files bound at /run/board;
- fresh keys per farm: an ed25519 client key, a host key per board and a known_hosts file, all
  mode 0600 in the farm's state directory, named by the inventory it writes;
- with `--sudo BOARD,...`, those boards log in as a user that is not root (SUDO_USER, as on
  Raspberry Pi OS) and gets root with `sudo -n` (NOPASSWD), the inventory saying
  `become = "sudo"`: the board's mount namespace gets copies of /etc/passwd and /etc/group with
  that user added, an /etc/shadow with no password for anyone, and an /etc/sudoers granting
  it, bound over the originals there only (this machine's /etc is never changed; sudo must be
  installed here, ./setup.sh does).

The inventory it writes is an ordinary boards.toml: `lab up --boards farm.toml` cannot tell
these boards from real ones.
"""

from __future__ import annotations

import ipaddress
import os
import shlex
from pathlib import Path

from mininet.topo import Topo

from lab.substrate.local.build import up
from lab.substrate.local.lab import Lab
from lab.core import proc
from lab.core.errors import ConfigError, PreconditionError
from lab.core.state import lab_dir, list_lab_ids, new_lab_id, state_root, write_json_atomic
from lab.model.labspec import LabSpec
from lab.model.topology import resolve
import time
import json
from lab.core.state import Ledger
from lab.core.teardown import teardown
from lab.substrate.boards.lab import is_board_lab
from lab.substrate.boards.restore import restore
from pyroute2 import IPRoute
from pyroute2 import NetNS

MGMT_SWITCH = "mgmt"
MGMT_IF = "eth0"
#: management subnets are picked from here, skipping any this machine already routes
MGMT_POOL = ipaddress.ip_network("172.30.0.0/16")
SSHD = "/usr/sbin/sshd"
SUDO = "/usr/bin/sudo"
#: the login user of a `--sudo` board (Raspberry Pi OS's first user is traditionally "pi")
SUDO_USER = "pi"
#: the home directory of the inventory's login user (root), empty on every board
LOGIN_HOME = os.path.expanduser("~root")
SSHD_CONFIG = """\
ListenAddress {addr}
Port 22
HostKey /run/board/host_key
AuthorizedKeysFile /run/board/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
LogLevel ERROR
"""


def data_names(spec: LabSpec) -> dict[tuple[str, str], str]:
    """(node, topology ifname) -> the farm board's interface name: eth1, eth2, ... per node in
    link order (eth0 is the management port)."""
    out: dict[tuple[str, str], str] = {}
    count: dict[str, int] = {}
    for lk in spec.links:
        for node, ifname in ((lk.node1, lk.intf1), (lk.node2, lk.intf2)):
            count[node] = count.get(node, 0) + 1
            out[(node, ifname)] = f"eth{count[node]}"
    return out


def farm_spec(spec: LabSpec, subnet: ipaddress.IPv4Network) -> LabSpec:
    """The farm as a lab: the topology's hosts as bare boards (no addresses, routes or
    forwarding on their data ports) plus the management switch."""
    switches = [n.name for n in spec.nodes.values() if n.kind == "switch"]
    if switches:
        raise ConfigError(
            f"switch {switches[0]!r}: boards connect by point-to-point cables only",
            source=spec.source,
        )
    if MGMT_SWITCH in spec.nodes:
        raise ConfigError(
            f"node name {MGMT_SWITCH!r} is the farm's management switch; rename the node",
            source=spec.source,
        )
    names = data_names(spec)
    hosts = spec.hosts()
    addrs = list(subnet.hosts())

    class Farm(Topo):
        def build(self):
            self.addSwitch(MGMT_SWITCH)
            for n in hosts:
                self.addHost(n.name, **({"cpu": n.cpu} if n.cpu is not None else {}))
            for i, n in enumerate(hosts):
                self.addLink(
                    n.name, MGMT_SWITCH, intfName1=MGMT_IF,
                    params1={"ip": f"{addrs[i]}/{subnet.prefixlen}"},
                )  # fmt: skip
            for lk in spec.links:
                # the cable: as fast as the topology's link (a tbf of the farm's own, below
                # anything a board lab puts there), with its MTU
                opts = {k: v for k, v in (("bw", lk.bw), ("mtu", lk.mtu)) if v}
                self.addLink(
                    lk.node1, lk.node2,
                    intfName1=names[(lk.node1, lk.intf1)], intfName2=names[(lk.node2, lk.intf2)],
                    **opts,
                )  # fmt: skip

    fs = resolve(Farm(), source=f"board farm of {spec.source}", topo_name="farm")
    for n in fs.hosts():
        n.routes = []
        n.default_route = None
        n.router = False
        n.vpn = n.traffic = None
        for i in n.interfaces:
            if i.name != MGMT_IF:
                i.ip = i.ip6 = None
            else:
                i.ip6 = None
    return fs


def _routed_networks() -> list[ipaddress.IPv4Network]:
    nets = []
    with IPRoute() as ipr:
        for r in ipr.get_routes(family=2):
            dst = r.get_attr("RTA_DST") or "0.0.0.0"
            if r["dst_len"] == 0:
                continue
            nets.append(ipaddress.ip_network(f"{dst}/{r['dst_len']}", strict=False))
    return nets


def free_subnet(taken: list[ipaddress.IPv4Network] | None = None) -> ipaddress.IPv4Network:
    """The first /24 of MGMT_POOL that no route of this machine and no other farm overlaps."""
    taken = list(_routed_networks() if taken is None else taken)
    for other in list_farms():
        taken.append(ipaddress.ip_network(other["subnet"]))
    for net in MGMT_POOL.subnets(new_prefix=24):
        if not any(net.overlaps(t) for t in taken):
            return net
    raise PreconditionError(f"no free /24 left in {MGMT_POOL} for a farm's management network")


def list_farms() -> list[dict]:
    out = []
    for lab_id in list_lab_ids():
        try:
            info = json.loads((lab_dir(lab_id) / "lab.json").read_text())
        except (OSError, ValueError):
            continue
        if info.get("farm"):
            out.append({"id": lab_id, **info["farm"]})
    return out


def _keygen(path: Path, comment: str) -> str:
    proc.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    return path.with_suffix(".pub").read_text().strip()


def emulate(
    spec: LabSpec, out: Path, farm_id: str | None = None, sudo: tuple[str, ...] = ()
) -> dict:
    """Build the farm for `spec` and write its inventory to `out`; the boards named in `sudo`
    log in as SUDO_USER and become root with sudo. Returns the farm record."""
    hosts = [n.name for n in spec.hosts()]
    unknown = [b for b in sudo if b not in hosts]
    if unknown:
        raise ConfigError(
            f"no board {unknown[0]!r} in this farm; accepted: {', '.join(hosts)}",
            source="lab boards emulate",
            field="--sudo",
        )
    if not os.path.exists(SSHD):
        raise PreconditionError(f"{SSHD} missing: install openssh-server (./setup.sh does)")
    if sudo and not (os.path.exists(SUDO) and os.path.exists("/etc/sudoers")):
        raise PreconditionError(f"{SUDO} missing: install sudo (./setup.sh does)")
    out = Path(out).absolute()
    if out.exists():
        raise PreconditionError(f"{out} exists; remove it or choose another --out")
    subnet = free_subnet()
    fspec = farm_spec(spec, subnet)
    farm_id = farm_id or new_lab_id("f")
    lab = up(fspec, farm_id)
    try:
        record = _finish(lab, spec, subnet, out, sudo)
    except BaseException:
        teardown(farm_id)
        raise
    return record


def _finish(lab: Lab, spec: LabSpec, subnet, out: Path, sudo: tuple[str, ...] = ()) -> dict:
    d = lab.dir / "farm"
    d.mkdir(mode=0o700)
    host_ip = list(subnet.hosts())[-1]
    mgmt_ns = lab.info["nodes"][MGMT_SWITCH]["netns"]
    host_if = f"lab-{lab.id}"[:15]
    lab.ledger.record("hostveth", ifname=host_if, peer_ns=mgmt_ns)
    _host_veth(host_if, mgmt_ns, f"{host_ip}/{subnet.prefixlen}")

    client_pub = _keygen(d / "id_ed25519", f"lab farm {lab.id}")
    known = []
    boards = {}
    names = data_names(spec)
    for n in lab.spec.hosts():
        bdir = d / "boards" / n.name
        # 0755: sshd reads authorized_keys as the login user (its host key stays 0600)
        bdir.mkdir(parents=True, mode=0o755)
        bdir.chmod(0o755)
        addr = next(i.ip for i in n.interfaces if i.name == MGMT_IF).split("/")[0]
        host_pub = _keygen(bdir / "host_key", f"{n.name}@{lab.id}")
        (bdir / "authorized_keys").write_text(client_pub + "\n")
        (bdir / "authorized_keys").chmod(0o644)
        config = SSHD_CONFIG.format(addr=addr)
        # the board's CPU is its profile's: the crypto masks a local lab gives the node's
        # processes reach every command on the board (lab/substrate/vm/agent.py LAB_AGENT_KEEP_ENV)
        masks = {k: v for k, v in (lab.info["nodes"][n.name].get("env") or {}).items() if v}
        if masks:
            pairs = {**masks, "LAB_AGENT_KEEP_ENV": ",".join(sorted(masks))}
            config += "SetEnv " + " ".join(f'"{k}={v}"' for k, v in sorted(pairs.items())) + "\n"
        (bdir / "sshd_config").write_text(config)
        known.append(f"{addr} {host_pub}")
        node = lab.node(n.name)
        root = str(state_root())
        script = (
            "mkdir -p /run/board /run/sshd"
            f" && mount --bind {shlex.quote(str(bdir))} /run/board"
            f" && mount -t tmpfs -o mode=0755,size=64m lab-board {shlex.quote(root)}"
            f" && mount -t tmpfs -o mode=0700,size=16m lab-board-home {shlex.quote(LOGIN_HOME)}"
        )
        if n.name in sudo:
            script += _sudo_user(bdir, sorted(masks))
        node.run(["sh", "-c", script])
        node.spawn("sshd", [SSHD, "-D", "-e", "-f", "/run/board/sshd_config"])
        boards[n.name] = {
            "host": addr,
            "user": SUDO_USER if n.name in sudo else "root",
            "data": [names[(n.name, i.name)] for i in spec.nodes[n.name].interfaces],
        }
    kh = d / "known_hosts"
    kh.write_text("\n".join(known) + "\n")
    kh.chmod(0o600)
    _wait_sshd(lab, boards)
    _wait_link_local(lab, boards)

    lines = [
        f"# Emulated board farm {lab.id} (`lab boards emulate`) for {spec.source}.",
        f"# Remove it with `lab boards emulate --down --id {lab.id}`.",
        "",
    ]
    for name, b in boards.items():
        lines += [
            f"[boards.{name}]",
            f'host = "{b["host"]}"',
            f'user = "{b["user"]}"',
            f'key = "{d / "id_ed25519"}"',
            f'become = "{"sudo" if b["user"] != "root" else "root"}"',
            f'mgmt = "{MGMT_IF}"',
            "data = [" + ", ".join(f'"{x}"' for x in b["data"]) + "]",
            f'ssh_options = ["UserKnownHostsFile={kh}", "GlobalKnownHostsFile=/dev/null"]',
            "",
        ]
    for lk in spec.links:
        a = f"{lk.node1}:{names[(lk.node1, lk.intf1)]}"
        b = f"{lk.node2}:{names[(lk.node2, lk.intf2)]}"
        lines += ["[[cables]]", f'a = "{a}"', f'b = "{b}"', ""]
    out.write_text("\n".join(lines))
    record = {
        "subnet": str(subnet),
        "controller": str(host_ip),
        "host_interface": host_if,
        "inventory": str(out),
        "topology": spec.source,
        "boards": boards,
    }
    lab.info["farm"] = record
    write_json_atomic(lab.dir / "lab.json", lab.info)
    return {"id": lab.id, **record}


def _sudo_user(bdir: Path, keep_env: list[str]) -> str:
    """Write the board's /etc files for SUDO_USER into `bdir`; returns the shell commands (run
    in the board's mount namespace) that bind them over /etc there and make the user's home.
    The uid and gid are the first >= 1000 free in this machine's files."""
    passwd = Path("/etc/passwd").read_text()
    group = Path("/etc/group").read_text()
    if any(x.split(":")[0] == SUDO_USER for x in (passwd + group).splitlines()):
        raise PreconditionError(
            f"this machine already has a user or group {SUDO_USER!r}: the farm's board user "
            "must be new (boards.farm.SUDO_USER)"
        )
    taken = {int(x.split(":")[2]) for x in (passwd + group).splitlines() if x.count(":") >= 3}
    uid = next(i for i in range(1000, 60000) if i not in taken)
    home = f"/run/home/{SUDO_USER}"
    passwd = passwd.rstrip("\n") + f"\n{SUDO_USER}:x:{uid}:{uid}:lab farm board:{home}:/bin/sh\n"
    group = group.rstrip("\n") + f"\n{SUDO_USER}:x:{uid}:\n"
    # no password hash of this machine's is copied: "*" (no password, not locked) for everyone
    shadow = "".join(
        f"{x.split(':')[0]}:*:19000:0:99999:7:::\n" for x in passwd.splitlines() if ":" in x
    )
    keep = f'Defaults env_keep += "{" ".join(["LAB_AGENT_KEEP_ENV", *keep_env])}"\n'
    sudoers = (
        "Defaults env_reset\n"
        + (keep if keep_env else "")
        + 'Defaults secure_path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"\n'
        + "root ALL=(ALL:ALL) ALL\n"
        + f"{SUDO_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n"
    )
    files = {"passwd": (passwd, 0o644), "group": (group, 0o644), "shadow": (shadow, 0o640),
             "sudoers": (sudoers, 0o440)}  # fmt: skip
    etc = bdir / "etc"
    etc.mkdir(mode=0o755)
    binds = []
    for name, (text, mode) in files.items():
        (etc / name).write_text(text)
        (etc / name).chmod(mode)
        # through /run/board: the board's tmpfs over the state root hides the farm's directory
        binds.append(f" && mount --bind /run/board/etc/{name} /etc/{name}")
    return "".join(binds) + f" && mkdir -p {home} && chown {uid}:{uid} {home}"


def _host_veth(host_if: str, mgmt_ns: str, cidr: str) -> None:
    addr, plen = cidr.split("/")
    with IPRoute() as ipr:
        ipr.link("add", ifname=host_if, kind="veth", peer={"ifname": "ctl0", "net_ns_fd": mgmt_ns})
        idx = ipr.link_lookup(ifname=host_if)[0]
        ipr.addr("add", index=idx, address=addr, prefixlen=int(plen))
        ipr.link("set", index=idx, state="up")
    with NetNS(mgmt_ns) as ns:
        br = ns.link_lookup(ifname="br0")[0]
        idx = ns.link_lookup(ifname="ctl0")[0]
        ns.link("set", index=idx, master=br, state="up")


def _wait_sshd(lab: Lab, boards: dict, timeout: float = 15.0) -> None:
    """Until each board's sshd listens on its management address."""

    for name, b in boards.items():
        node = lab.node(name)
        deadline = time.monotonic() + timeout
        while True:
            cp = node.run(["ss", "-Hltn", f"src {b['host']} and sport = :22"], check=False)
            if cp.returncode == 0 and cp.stdout.strip():
                break
            if time.monotonic() > deadline:
                log = lab.dir / "logs" / f"{name}-sshd.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise PreconditionError(f"sshd on board {name} not listening:\n{tail}")
            time.sleep(0.05)


def _wait_link_local(lab: Lab, boards: dict, timeout: float = 10.0) -> None:
    """Until every up interface of each board that has IPv6 has its link-local address (the
    kernel adds it when the link comes up, a moment after): a snapshot taken at once must not
    see it appear afterwards, as a fresh board has it from boot."""

    for name in boards:
        node = lab.node(name)
        deadline = time.monotonic() + timeout
        while True:
            cp = node.run(["ip", "-j", "addr", "show"], check=False)
            missing = [
                i["ifname"]
                for i in (json.loads(cp.stdout or "[]") if cp.returncode == 0 else [])
                if "UP" in i.get("flags", []) and i["ifname"] != "lo"
                and not any(a.get("scope") == "link" and a.get("family") == "inet6"
                            for a in i.get("addr_info", []))
                and node.run(["cat", f"/proc/sys/net/ipv6/conf/{i['ifname']}/disable_ipv6"],
                             check=False).stdout.strip() == "0"
            ]  # fmt: skip
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.05)


def farm_id(lab_id: str | None) -> str:
    """The farm to remove: `lab_id`, else the only farm on this machine."""
    farms = list_farms()
    if lab_id is not None:
        if not any(f["id"] == lab_id for f in farms):
            raise PreconditionError(
                f"no emulated board farm {lab_id!r}; farms: "
                + (", ".join(f["id"] for f in farms) or "none")
            )
        return lab_id
    if len(farms) != 1:
        raise PreconditionError(
            "choose the farm with --id: " + (", ".join(f["id"] for f in farms) or "no farm is up")
        )
    return farms[0]["id"]


def remove(lab_id: str) -> list[str]:
    """Tear the farm down (its lab's ledger) and delete the inventory it wrote. Labs still up
    on its boards are restored first: once the farm is gone nothing could reach them, and
    `lab clean` would report them forever."""

    info = next(f for f in list_farms() if f["id"] == lab_id)
    left = []
    for other in list_lab_ids():
        if other == lab_id or not is_board_lab(other):
            continue
        head = next(iter(Ledger(lab_dir(other) / "ledger.jsonl").entries()), {})
        if head.get("inventory") == info["inventory"]:
            left += [f"board lab {other}: {x}" for x in restore(other)]
    if left:  # keep the farm: the board labs on it are not restored yet
        return left
    left = teardown(lab_id)
    if not left:
        Path(info["inventory"]).unlink(missing_ok=True)
    return left
