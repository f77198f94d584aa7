"""lab.substrate.boards.inventory: reading and validating board inventories, mapping topologies onto boards.

Pure unit tests (no root, no board). Ansible inventories are parsed by the real ansible-inventory.
"""

from __future__ import annotations

import copy
import dataclasses
import textwrap
from pathlib import Path

import pytest

from lab.substrate.boards import ansible as ansmod
from lab.substrate.boards.mapping import board_spec, check_management, map_nodes, parse_map_option
from lab.substrate.boards.inventory import load_inventory
from lab.substrate.boards.types import Board, BoardMap, Cable
from lab.core.errors import ConfigError, PreconditionError
from lab.model.topology import load_topology

from .conftest import TOPOS

MIDDLEBOX = TOPOS / "pi_pair_middlebox.py"


def _have_ansible() -> bool:
    try:
        ansmod.ansible_inventory_tool()
    except PreconditionError:
        return False
    return True


needs_ansible = pytest.mark.skipif(
    not _have_ansible(), reason="ansible-inventory not installed (pip install ansible-core)"
)

BOARD = """\
[boards.{name}]
host = "{host}"
mgmt = "eth0"
data = ["eth1", "eth2"]
"""

# Three boards for client/router/server: pi-a (client) - pi-m (router) - pi-b (server).
FARM = """\
[boards.pi-a]
host = "192.168.1.21"
user = "pi"
port = 2201
key = "id_test"
become = "sudo"
mgmt = "eth0"
data = ["eth1"]
ssh_options = ["UserKnownHostsFile=/dev/null", "StrictHostKeyChecking=no"]

[boards.pi-m]
host = "192.168.1.22"
mgmt = "eth0"
data = ["eth1", "eth2"]

[boards.pi-b]
host = "pi-b.lan"
mgmt = "end0"
data = ["eth1"]

[[cables]]
a = "pi-a:eth1"
b = "pi-m:eth1"

[[cables]]
a = "pi-b:eth1"
b = "pi-m:eth2"
"""

MAP = {"client": "pi-a", "router": "pi-m", "server": "pi-b"}


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


@pytest.fixture
def farm(tmp_path):
    (tmp_path / "id_test").write_text("not a real key\n")
    return load_inventory(write(tmp_path, "farm.toml", FARM))


@pytest.fixture
def spec():
    return load_topology(MIDDLEBOX)


# --------------------------------------------------------------------------- good inventories


def test_toml_inventory(farm, tmp_path):
    a = farm.boards["pi-a"]
    assert a == Board(
        name="pi-a",
        host="192.168.1.21",
        mgmt="eth0",
        data=("eth1",),
        user="pi",
        port=2201,
        key=str(tmp_path / "id_test"),
        become="sudo",
        ssh_options=("UserKnownHostsFile=/dev/null", "StrictHostKeyChecking=no"),
    )
    m = farm.boards["pi-m"]
    assert (m.user, m.port, m.key, m.become, m.ssh_options) == (None, None, None, "root", ())
    assert list(farm.boards) == ["pi-a", "pi-m", "pi-b"]
    assert farm.cables == (
        Cable("pi-a", "eth1", "pi-m", "eth1"),
        Cable("pi-b", "eth1", "pi-m", "eth2"),
    )
    assert farm.sources == (str(tmp_path / "farm.toml"),)


def test_key_tilde_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_ed25519").write_text("k\n")
    p = write(tmp_path, "b.toml", BOARD.format(name="x", host="h") + 'key = "~/.ssh/id_ed25519"\n')
    assert load_inventory(p).boards["x"].key == str(tmp_path / ".ssh" / "id_ed25519")


YAML_HOSTS = """\
all:
  vars:
    lab_cables:
      - "pi-a:eth1=pi-m:eth1"
      - "pi-m:eth2=pi-b:eth1"
  children:
    pis:
      vars:
        lab_mgmt: eth0
      hosts:
        pi-a:
          ansible_host: 192.168.1.21
          ansible_user: pi
          ansible_become: true
          ansible_ssh_private_key_file: keys/id_a
          lab_data: [eth1]
        pi-m:
          ansible_host: 192.168.1.22
          ansible_port: 2222
          lab_data: [eth1, eth2]
        pi-b:
          ansible_user: root
          ansible_become: true
          lab_data: [eth1]
"""

INI_HOSTS = """\
[pis]
pi-a ansible_host=192.168.1.21 ansible_user=pi ansible_become=yes lab_data=eth1
pi-m ansible_host=192.168.1.22 ansible_port=2222 lab_data=eth1,eth2
pi-b ansible_user=root ansible_become=true lab_data=eth1

[pis:vars]
lab_mgmt=eth0

[all:vars]
lab_cables=pi-a:eth1=pi-m:eth1,pi-m:eth2=pi-b:eth1
"""


def _check_ansible_farm(inv, tmp_path, *, key=True):
    a, m, b = (inv.boards[n] for n in ("pi-a", "pi-m", "pi-b"))
    assert (a.host, a.user, a.become, a.mgmt, a.data) == (
        "192.168.1.21",
        "pi",
        "sudo",
        "eth0",
        ("eth1",),
    )
    if key:
        assert a.key == str(tmp_path / "keys" / "id_a")
    assert (m.host, m.port, m.become, m.data) == ("192.168.1.22", 2222, "root", ("eth1", "eth2"))
    # no ansible_host: the inventory hostname is the address; become as root needs no sudo
    assert (b.host, b.user, b.become) == ("pi-b", "root", "root")
    assert inv.cables == (
        Cable("pi-a", "eth1", "pi-m", "eth1"),
        Cable("pi-m", "eth2", "pi-b", "eth1"),
    )


@needs_ansible
def test_ansible_yaml(tmp_path):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id_a").write_text("k\n")
    inv = load_inventory(write(tmp_path, "hosts.yml", YAML_HOSTS))
    _check_ansible_farm(inv, tmp_path)


@needs_ansible
def test_ansible_ini(tmp_path):
    inv = load_inventory(write(tmp_path, "hosts", INI_HOSTS))
    _check_ansible_farm(inv, tmp_path, key=False)


@needs_ansible
def test_toml_with_ansible(tmp_path):
    """Connection fields from hosts.yml; the toml adds mgmt/data, overrides one and adds cables."""
    write(
        tmp_path,
        "hosts.yml",
        """\
        all:
          hosts:
            pi-a: {ansible_host: 192.168.1.21, ansible_user: pi, ansible_become: true}
            pi-m: {ansible_host: 192.168.1.22, ansible_port: 2222}
        """,
    )
    p = write(
        tmp_path,
        "farm.toml",
        """\
        ansible = "hosts.yml"
        [boards.pi-a]
        mgmt = "eth0"
        data = ["eth1"]
        [boards.pi-m]
        port = 22
        mgmt = "eth0"
        data = ["eth1"]
        [[cables]]
        a = "pi-a:eth1"
        b = "pi-m:eth1"
        """,
    )
    inv = load_inventory(p)
    assert inv.boards["pi-a"] == Board(
        "pi-a", "192.168.1.21", "eth0", ("eth1",), user="pi", become="sudo"
    )
    assert inv.boards["pi-m"].port == 22  # the toml overrides ansible_port
    assert inv.cables == (Cable("pi-a", "eth1", "pi-m", "eth1"),)
    assert inv.sources == (str(p), str(tmp_path / "hosts.yml"))


@needs_ansible
def test_toml_with_ansible_limit(tmp_path):
    write(
        tmp_path,
        "hosts.yml",
        """\
        all:
          children:
            pis:
              hosts:
                pi-a: {lab_mgmt: eth0, lab_data: [eth1]}
            other:
              hosts:
                web: {}
        """,
    )
    p = write(tmp_path, "farm.toml", 'ansible = "hosts.yml"\nansible_limit = "pis"\n')
    assert list(load_inventory(p).boards) == ["pi-a"]


def test_ansible_tool_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(ansmod.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(ansmod.proc, "which", lambda tool: None)
    with pytest.raises(PreconditionError, match="ansible-inventory.*ansible-core"):
        load_inventory(write(tmp_path, "hosts.yml", YAML_HOSTS))


# --------------------------------------------------------------------------- bad inventories

TWO = BOARD.format(name="pi-a", host="10.9.0.1") + BOARD.format(name="pi-m", host="10.9.0.2")
CABLE = '[[cables]]\na = "{a}"\nb = "{b}"\n'


def board(extra: str = "", name: str = "pi-a", host: str = "10.9.0.1", drop: str = "") -> str:
    lines = BOARD.format(name=name, host=host).splitlines()
    return "\n".join(ln for ln in lines if not (drop and ln.startswith(drop))) + "\n" + extra


# (id, file text, board name expected in the message, field expected in the message)
BAD_TOML = [
    ("unknown-key", board('hots = "x"\n'), "pi-a", "hots"),
    ("missing-host", board(drop="host"), "pi-a", "host"),
    ("missing-mgmt", board(drop="mgmt"), "pi-a", "mgmt"),
    ("missing-data", board(drop="data"), "pi-a", "data"),
    ("empty-data", board(drop="data") + "data = []\n", "pi-a", "data"),
    ("data-not-list", board(drop="data") + 'data = "eth1"\n', "pi-a", "data"),
    ("host-not-string", board(drop="host") + "host = 5\n", "pi-a", "host"),
    ("host-dash", board(drop="host") + 'host = "-oProxyCommand=x"\n', "pi-a", "host"),
    ("user-not-string", board("user = 1\n"), "pi-a", "user"),
    ("port-zero", board("port = 0\n"), "pi-a", "port"),
    ("port-high", board("port = 70000\n"), "pi-a", "port"),
    ("port-string", board('port = "22"\n'), "pi-a", "port"),
    ("port-bool", board("port = true\n"), "pi-a", "port"),
    ("become-bad", board('become = "doas"\n'), "pi-a", "become"),
    ("become-root-user-pi", board('user = "pi"\n'), "pi-a", "become"),
    ("key-missing", board('key = "nowhere/id"\n'), "pi-a", "key"),
    (
        "ssh-option-bad",
        board('ssh_options = ["StrictHostKeyChecking no"]\n'),
        "pi-a",
        "ssh_options",
    ),
    ("dup-data", board(drop="data") + 'data = ["eth1", "eth1"]\n', "pi-a", "data"),
    ("mgmt-in-data", board(drop="data") + 'data = ["eth0", "eth1"]\n', "pi-a", "data"),
    ("ifname-long", board(drop="data") + 'data = ["a23456789012345x"]\n', "pi-a", "data"),
    ("ifname-slash", board(drop="data") + 'data = ["eth/1"]\n', "pi-a", "data"),
    ("ifname-space", board(drop="mgmt") + 'mgmt = "eth 0"\n', "pi-a", "mgmt"),
    ("bad-board-name", board(name='"-pi"'), "-pi", "host"),
    ("board-not-table", 'boards.pi-a = "x"\n', "pi-a", "boards.pi-a"),
    ("dup-host", TWO.replace("10.9.0.2", "10.9.0.1"), "pi-m", "host"),
    (
        "cable-unknown-board",
        TWO + CABLE.format(a="pi-a:eth1", b="pi-x:eth1"),
        "pi-x",
        "cables[0].b",
    ),
    ("cable-not-data", TWO + CABLE.format(a="pi-a:eth1", b="pi-m:eth7"), "pi-m", "cables[0].b"),
    ("cable-mgmt", TWO + CABLE.format(a="pi-a:eth0", b="pi-m:eth1"), "pi-a", "cables[0].a"),
    ("cable-same-end", TWO + CABLE.format(a="pi-a:eth1", b="pi-a:eth1"), "pi-a", "cables[0]"),
    (
        "cable-reused",
        TWO
        + CABLE.format(a="pi-a:eth1", b="pi-m:eth1")
        + CABLE.format(a="pi-m:eth2", b="pi-a:eth1"),
        "pi-a",
        "cables[1]",
    ),
    ("cable-malformed", TWO + CABLE.format(a="pi-a-eth1", b="pi-m:eth1"), "pi-a", "cables[0].a"),
    ("cable-two-colons", TWO + CABLE.format(a="pi-a:eth1:x", b="pi-m:eth1"), "pi-a", "cables[0].a"),
    ("cable-bad-board", TWO + CABLE.format(a="pi a:eth1", b="pi-m:eth1"), "pi a", "cables[0].a"),
    (
        "cable-unknown-key",
        TWO + CABLE.format(a="pi-a:eth1", b="pi-m:eth1") + 'c = "x"\n',
        "",
        "cables[0]",
    ),
    ("cable-missing-b", TWO + '[[cables]]\na = "pi-a:eth1"\n', "", "cables[0]"),
]


@pytest.mark.parametrize(
    "text,board_name,field", [b[1:] for b in BAD_TOML], ids=[b[0] for b in BAD_TOML]
)
def test_bad_toml(tmp_path, text, board_name, field):
    p = write(tmp_path, "farm.toml", text)
    with pytest.raises(ConfigError) as e:
        load_inventory(p)
    msg = str(e.value)
    assert "farm.toml" in msg and board_name in msg and field in msg, msg


@pytest.mark.parametrize(
    "text,field",
    [
        ("[boards.pi-a\nhost = 1\n", "line 1"),
        ('colour = "x"\n', "accepted: boards, cables, ansible"),
        ("", "defines no boards"),
        ('ansible = "missing.yml"\n', "missing.yml"),
        ('ansible_limit = "pis"\n', "ansible_limit"),
    ],
    ids=["syntax", "unknown-top-key", "empty", "ansible-missing", "limit-without-ansible"],
)
def test_bad_toml_file(tmp_path, text, field):
    p = write(tmp_path, "farm.toml", text)
    with pytest.raises(ConfigError, match="farm.toml") as e:
        load_inventory(p)
    assert field in str(e.value)


def test_inventory_missing(tmp_path):
    with pytest.raises(ConfigError, match="nothere.toml.*not found"):
        load_inventory(tmp_path / "nothere.toml")


BAD_ANSIBLE = [
    ("port", "pi-a: {ansible_port: 99999, lab_mgmt: eth0, lab_data: [eth1]}", "ansible_port"),
    ("mgmt-missing", "pi-a: {lab_data: [eth1]}", "lab_mgmt"),
    ("data-missing", "pi-a: {lab_mgmt: eth0}", "lab_data"),
    ("lab-typo", "pi-a: {lab_mgmt: eth0, lab_dta: [eth1]}", "lab_dta"),
    (
        "become-method",
        "pi-a: {ansible_become: true, ansible_become_method: su, lab_mgmt: eth0, lab_data: [eth1]}",
        "ansible_become_method",
    ),
    (
        "become-no-user",
        "pi-a: {ansible_user: pi, lab_mgmt: eth0, lab_data: [eth1]}",
        "ansible_become",
    ),
    (
        "become-not-bool",
        "pi-a: {ansible_become: maybe, lab_mgmt: eth0, lab_data: [eth1]}",
        "ansible_become",
    ),
]


@needs_ansible
@pytest.mark.parametrize(
    "host,field", [b[1:] for b in BAD_ANSIBLE], ids=[b[0] for b in BAD_ANSIBLE]
)
def test_bad_ansible(tmp_path, host, field):
    p = write(tmp_path, "hosts.yml", f"all:\n  hosts:\n    {host}\n")
    with pytest.raises(ConfigError) as e:
        load_inventory(p)
    msg = str(e.value)
    assert "hosts.yml" in msg and "pi-a" in msg and field in msg, msg


@needs_ansible
def test_bad_ansible_cable(tmp_path):
    p = write(
        tmp_path,
        "hosts.yml",
        """\
        all:
          vars: {lab_cables: ["pi-a:eth1=pi-b:eth1"]}
          hosts:
            pi-a: {lab_mgmt: eth0, lab_data: [eth1]}
        """,
    )
    with pytest.raises(ConfigError, match=r"hosts.yml: lab_cables\[0\].b: unknown board 'pi-b'"):
        load_inventory(p)


@needs_ansible
def test_toml_with_ansible_missing_mgmt(tmp_path):
    write(tmp_path, "hosts.yml", "all:\n  hosts:\n    pi-a: {ansible_host: 10.1.1.1}\n")
    p = write(tmp_path, "farm.toml", 'ansible = "hosts.yml"\n[boards.pi-a]\ndata = ["eth1"]\n')
    with pytest.raises(ConfigError, match=r"farm.toml: boards.pi-a.mgmt: missing \(or lab_mgmt in"):
        load_inventory(p)


@needs_ansible
def test_ansible_unparsable(tmp_path):
    p = write(tmp_path, "hosts.yml", "all: [\n")
    with pytest.raises(ConfigError, match="hosts.yml: ansible-inventory cannot read"):
        load_inventory(p)


# --------------------------------------------------------------------------- --map


def test_parse_map_option():
    assert parse_map_option(["client=pi-a", "server=pi-b, router=pi-m"]) == MAP | {}


@pytest.mark.parametrize(
    "values", [["client"], ["=pi-a"], ["client="], ["client=pi-a", "client=pi-b"]]
)
def test_parse_map_option_bad(values):
    with pytest.raises(ConfigError, match="--map"):
        parse_map_option(values)


# --------------------------------------------------------------------------- map_nodes


def test_map_nodes(spec, farm):
    bmap = map_nodes(spec, farm, MAP)
    assert bmap.nodes == MAP
    assert bmap.interfaces == {
        ("client", "client-eth0"): "eth1",
        ("router", "router-eth0"): "eth1",
        ("router", "router-eth1"): "eth2",
        ("server", "server-eth0"): "eth1",
    }


def test_map_nodes_by_name(spec, tmp_path):
    text = "".join(BOARD.format(name=n, host=f"10.9.0.{i}") for i, n in enumerate(MAP))
    text += CABLE.format(a="router:eth2", b="server:eth1") + CABLE.format(
        a="client:eth1", b="router:eth1"
    )
    bmap = map_nodes(spec, load_inventory(write(tmp_path, "farm.toml", text)))
    assert bmap.nodes == {n: n for n in MAP}
    assert bmap.interfaces[("router", "router-eth0")] == "eth1"
    assert bmap.interfaces[("router", "router-eth1")] == "eth2"


def test_map_nodes_deterministic_cable_choice(tmp_path, spec):
    """Two cables between the same boards: links take them in inventory order."""
    text = FARM.replace('data = ["eth1"]\nssh', 'data = ["eth1", "eth2"]\nssh').replace(
        'key = "id_test"\n', ""
    )
    text += CABLE.format(a="pi-m:eth3", b="pi-a:eth2")
    text = text.replace(
        'data = ["eth1", "eth2"]\n\n[boards.pi-b]',
        'data = ["eth1", "eth2", "eth3"]\n\n[boards.pi-b]',
    )
    inv = load_inventory(write(tmp_path, "farm.toml", text))
    assert map_nodes(spec, inv, MAP) == map_nodes(spec, inv, MAP)
    assert map_nodes(spec, inv, MAP).interfaces[("client", "client-eth0")] == "eth1"


def _mapping_error(spec, inv, overrides) -> str:
    with pytest.raises(ConfigError) as e:
        map_nodes(spec, inv, overrides)
    return str(e.value)


def test_map_miscabled(spec, tmp_path):
    """The router-server cable is missing: the link names both boards and the cables."""
    text = FARM.replace('key = "id_test"\n', "").split('[[cables]]\na = "pi-b')[0]
    msg = _mapping_error(spec, load_inventory(write(tmp_path, "farm.toml", text)), MAP)
    assert "pi_pair_middlebox.py: link router-server: no free cable between pi-m and pi-b" in msg
    assert "farm.toml" in msg and "pi-a:eth1=pi-m:eth1 (used by link client-router)" in msg


@pytest.mark.parametrize(
    "overrides,expect",
    [
        (
            {"client": "pi-a", "router": "pi-m"},
            ["node server", "no board", "farm.toml", "free boards: pi-b"],
        ),
        ({**MAP, "server": "pi-z"}, ["--map", "server=pi-z", "unknown board 'pi-z'", "farm.toml"]),
        ({**MAP, "sever": "pi-b"}, ["--map", "sever=pi-b", "pi_pair_middlebox.py", "nodes: "]),
        (
            {**MAP, "server": "pi-a"},
            ["node server", "client and server are both on board pi-a", "farm.toml"],
        ),
    ],
    ids=["unmapped", "unknown-board", "unknown-node", "two-on-one"],
)
def test_map_bad(spec, farm, overrides, expect):
    msg = _mapping_error(spec, farm, overrides)
    for word in expect:
        assert word in msg, msg


def test_map_refuses_switch(farm, tmp_path):
    topo = write(
        tmp_path,
        "lan.py",
        """\
        from mininet.topo import Topo

        class Lan(Topo):
            def build(self):
                s1 = self.addSwitch("s1")
                for h in ("client", "server"):
                    self.addLink(self.addHost(h), s1)

        topos = {"lan": Lan}
        """,
    )
    msg = _mapping_error(load_topology(topo), farm, {"client": "pi-a", "server": "pi-b"})
    assert "lan.py: switch s1: boards connect point-to-point cables only" in msg


# --------------------------------------------------------------------------- board_spec


def test_board_spec(spec, farm):
    before = copy.deepcopy(spec)
    bmap = map_nodes(spec, farm, MAP)
    out = board_spec(spec, bmap)
    assert spec == before  # input untouched
    for name, n in out.nodes.items():
        data = farm.boards[bmap.nodes[name]].data
        for i in n.interfaces:
            assert i.name in data
            assert i.peer_name in farm.boards[bmap.nodes[i.peer_node]].data
        for r in n.routes:
            assert r["dev"] in data
    for lk in out.links:
        assert lk.intf1 in farm.boards[bmap.nodes[lk.node1]].data
        assert lk.intf2 in farm.boards[bmap.nodes[lk.node2]].data
    # each link's ends are a cable of the inventory
    cables = {frozenset(c.ends()) for c in farm.cables}
    for lk in out.links:
        ends = {(bmap.nodes[lk.node1], lk.intf1), (bmap.nodes[lk.node2], lk.intf2)}
        assert frozenset(ends) in cables
    # everything but the names is the same
    assert [i.ip for i in out.nodes["router"].interfaces] == [
        i.ip for i in spec.nodes["router"].interfaces
    ]
    assert out.nodes["router"].interfaces[1].name == "eth2"
    assert out.nodes["server"].interfaces[0].peer_name == "eth2"


def test_board_spec_default_route_dev(spec, farm):
    spec.nodes["client"].default_route = "dev client-eth0"
    out = board_spec(spec, map_nodes(spec, farm, MAP))
    assert out.nodes["client"].default_route == "dev eth1"
    assert spec.nodes["client"].default_route == "dev client-eth0"


# --------------------------------------------------------------------------- check_management


def test_check_management_overlap(spec, farm):
    bmap = map_nodes(spec, farm, MAP)
    with pytest.raises(ConfigError) as e:
        check_management(spec, bmap, farm, {"pi-b": ["10.0.1.5/24", "fe80::1/64"]})
    msg = str(e.value)
    assert "pi_pair_middlebox.py" in msg and "node client" in msg and "ip" in msg, msg
    assert "10.0.1.0/24" in msg and "pi-b:end0" in msg


def test_check_management_disjoint(spec, farm):
    bmap = map_nodes(spec, farm, MAP)
    mgmt = {
        b: [f"192.168.1.{20 + i}/24", "fe80::1/64", "fd99::5/64"] for i, b in enumerate(farm.boards)
    }
    check_management(spec, bmap, farm, mgmt)


def test_check_management_route_dst(spec, farm):
    """A route destination reaching the management network is refused too (v6 here)."""
    bmap = map_nodes(spec, farm, MAP)
    with pytest.raises(ConfigError, match=r"node client route dst.*fd00:2::/64"):
        check_management(spec, bmap, farm, {"pi-m": ["fd00:2::99/64"]})


def test_check_management_wide_mgmt_network(spec, farm):
    bmap = map_nodes(spec, farm, MAP)
    # a /16 management network overlaps both topology subnets; the first thing found is named
    with pytest.raises(
        ConfigError, match="pi_pair_middlebox.py: node client interface client-eth0 ip"
    ):
        check_management(spec, bmap, farm, {"pi-a": ["10.0.77.1/16"]})


def test_check_management_mgmt_interface(spec, farm):
    bmap = map_nodes(spec, farm, MAP)
    bad = dataclasses.replace(
        bmap, interfaces={**bmap.interfaces, ("client", "client-eth0"): "eth0"}
    )
    with pytest.raises(ConfigError, match="node client.*management interface eth0"):
        check_management(spec, bad, farm, {})


def test_boardmap_type():
    assert BoardMap(nodes={}, interfaces={}).nodes == {}
