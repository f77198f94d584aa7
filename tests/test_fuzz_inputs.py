"""Bad input, end to end (issue 22): malformed inputs of every kind through the `lab` CLI.

A generator of our own over the input grammars (topology files, VPN profiles and --vpn
overrides, impairment specs, plans and -o overrides, lab ids, node names, board inventories,
CLI argument vectors), seeded, so a failure reproduces. Every input must give:

- exit code 2 (bad input) or 3 (conflict with this machine's state), never 0 or a traceback;
- a message naming the offending file or flag and the field;
- nothing created: no entry under LAB_STATE_DIR / LAB_RUN_DIR, no run directory, no rendered
  file, no network namespace (the subprocess sample compares `ip netns list`).

The bulk runs in-process through lab.cli.main.main(argv) with the functions that create things
(lab directory, run directory, rendered files, VM, boards, farm) replaced by a tripwire, so an
input that would be accepted is caught before it builds anything; a sample runs through the
real entry point (`python -m lab.cli.main`) as a subprocess, and tests/test_fuzz_cli.py sends
120 of them through the installed `lab` executable, comparing the machine before and after.
`python tests/test_fuzz_inputs.py` prints the cases per class and how many gave a clear error.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import subprocess
import sys
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SEED = 22

PI_PAIR = REPO / "topologies" / "pi_pair.py"
QUICK = (REPO / "plans" / "quick.toml").read_text()

GOOD_TOPO = """\
from mininet.topo import Topo


class T(Topo):
    def build(self):
        a = self.addHost("a", vpn="client")
        b = self.addHost("b", vpn="server")
        self.addLink(a, b)


topos = {"t": T}
"""

GOOD_INVENTORY = """\
[boards.pi-a]
host = "192.0.2.21"
mgmt = "eth0"
data = ["eth1"]

[boards.pi-b]
host = "192.0.2.22"
mgmt = "eth0"
data = ["eth1"]

[[cables]]
a = "pi-a:eth1"
b = "pi-b:eth1"
"""

GOOD_PROFILE = 'driver = "wireguard"\ndescription = "x"\n[params]\n'


@dataclass
class Case:
    klass: str  # what is wrong: empty, type, duplicate, range, unknown, name, path, ...
    kind: str  # which input: topology, vpn, impair, plan, id, node, inventory, cli
    argv: list[str]
    names: tuple[str, ...]  # each must appear in the message (the file or flag, the field)
    codes: tuple[int, ...] = (2,)
    may_accept: bool = False  # a random mutation may have produced a valid input

    def __str__(self) -> str:
        words = " ".join(repr(a if len(a) <= 80 else a[:80] + "...") for a in self.argv[:12])
        return f"[{self.kind}/{self.klass}] lab {words}{' ...' if len(self.argv) > 12 else ''}"


#: (text in a topology body, what the message must then name): the node, option or rule
AT_FAULT = (
    ("ghost", "ghost"),
    ("spook", "spook"),
    ("colour", "colour"),
    ("speed", "speed"),
    ('"mac"', "mac"),
    ('addHost("a", router=True)', "defined twice"),
    ('addSwitch("a")', "defined twice"),
    ('intfName1="x")\n', "used twice"),
    ('"10.0.1.1/24"', "assigned twice"),
    ("addLink(a, a)", "two different nodes"),
    ("cpu=", "cpu"),
    ('"ip"', "ip"),
    ("ip=", "ip"),
    ("params1=5", "params1"),
    ("intfName1", "intfName1"),
    ("max_queue_size", "max_queue_size"),
    ("bw=", "bw"),
    ("mtu=", "mtu"),
    ("loss=", "loss"),
    ("delay=", "delay"),
    ("router=", "router"),
    ("vpn=", "vpn"),
    ("defaultRoute", "defaultRoute"),
    ("impair=", "impair"),
)


def _at_fault(body: str) -> tuple[str, ...]:
    return next(((word,) for text, word in AT_FAULT if text in body), ())


class WouldCreate(BaseException):
    """An input got as far as creating something: the tripwire."""


# --------------------------------------------------------------------------- generators


class Gen:
    def __init__(self, root: Path, rng: random.Random):
        self.root = root
        self.rng = rng
        self.cases: list[Case] = []
        self.n = 0
        (root / "in").mkdir(parents=True, exist_ok=True)
        self.out = root / "out"  # never created by a refused input

    def file(self, suffix: str, content: str | bytes) -> str:
        self.n += 1
        p = self.root / "in" / f"f{self.n}{suffix}"
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
        return str(p)

    def add(self, klass, kind, argv, names, codes=(2,)):
        self.cases.append(Case(klass, kind, [str(a) for a in argv], tuple(names), tuple(codes)))

    # --- topology files: through `lab up` (and `lab render`, `lab boards emulate`)
    def topology(self):
        def topo(body: str) -> str:
            return (
                "from mininet.topo import Topo\n\n\nclass T(Topo):\n    def build(self):\n"
                + "".join(f"        {line}\n" for line in body.splitlines())
                + '\n\ntopos = {"t": T}\n'
            )

        ab = 'a = self.addHost("a")\nb = self.addHost("b")\n'

        def host(opts: str) -> str:  # host "a" with `opts`, and a plain "b"
            return f'self.addHost("a", {opts})\nself.addHost("b")'

        def link(opts: str) -> str:  # hosts "a" and "b", linked with `opts`
            return ab + f"self.addLink(a, b, {opts})"

        def named(name: str) -> str:  # a host named `name`, and "b"
            return f'self.addHost("{name}")\nself.addHost("b")'

        bodies = {
            "empty": [
                'self.addHost("")',
                'self.addHost("   ")',
                link('params1={"ip": ""}'),
                host('vpn=""'),
                host('cpu=""'),
                link('impair=""'),
                link('intfName1=""'),
                host('defaultRoute=""'),
            ],
            "type": [
                link('bw="fast"'),
                link('mtu="big"'),
                host('router="yes"'),
                host("cpu=[1]"),
                link("params1=5"),
                'self.addHost("a", ip=5)\nb = self.addHost("b")\nself.addLink("a", b)',
                host("defaultRoute=5"),
                link("impair=5"),
                link("loss=True"),
                link('params1={"ip": 5}'),
            ],
            "duplicate": [
                'self.addHost("a")\nself.addHost("a", router=True)\nb = self.addHost("b")\n'
                'self.addLink("a", b)',
                link('intfName1="x"') + '\nself.addLink(a, b, intfName1="x")',
                link('params1={"ip": "10.0.1.1/24"}, params2={"ip": "10.0.1.1/24"}'),
                ab + 'self.addSwitch("a")',
            ],
            "range": [
                *(link(o) for o in ("bw=-1", "bw=1e12", "mtu=10", "loss=200")),
                host("cpu=0"),
                *(link(o) for o in ("max_queue_size=0", 'delay="-5ms"')),
                *(link(f'bw=float("{x}")') for x in ("nan", "inf")),
            ],
            "unknown": [
                host('colour="red"'),
                link("speed=1"),
                link('params1={"mac": "x"}'),
                host('cpu="z80"'),
            ],
            "name": [
                *(named(n) for n in ("1a", "a-b", "a b")),
                'self.addHost("lo")\nself.addHost("../b")',
                ab + 'self.addLink(a, "ghost")',
                ab + 'self.addLink("ghost", "spook")',
                ab + "self.addLink(a, a)",
            ],
            "huge": [
                named("a" * 5000),
                link("bw=10**400"),
                link(f'delay="{"9" * 500}ms"'),
            ],
            "unicode": [named("ñode"), named("a\u200b"), link('intfName1="éth0"')],
        }
        for klass, items in bodies.items():
            for body in items:
                f = self.file(".py", topo(body))
                self.add(klass, "topology", ["up", f, "--id", "fz"], (f, *_at_fault(body)))
        # files that are broken as files
        whole = {
            "empty": ["", "   \n\n", "topos = {}\n"],
            "type": ["topos = [1]\n", 'topos = {"t": 5}\n', "topos = None\n"],
            "truncated": [GOOD_TOPO[: len(GOOD_TOPO) // 2], GOOD_TOPO[: len(GOOD_TOPO) - 30]],
            "syntax": ["topos = {\n", "def (:\n", "class T(Topo)\n", "\tx = 1\n y = 2\n"],
            "exit": [
                "import sys\nsys.exit(0)\n",
                "import sys\nsys.exit(3)\n",
                "raise SystemExit\n",
                GOOD_TOPO.replace("        a = ", "        import sys; sys.exit(0)\n        a = "),
            ],
            "exception": ["raise RuntimeError('boom')\n", "import nosuchmodule\n", "1/0\n"],
        }
        for klass, items in whole.items():
            for text in items:
                f = self.file(".py", text)
                self.add(klass, "topology", ["up", f, "--id", "fz"], (f,))
        for raw in (b"\xff\xfe\x00bad", b"topos = {'t': 1}\x00\n", b"# \xe9\xe8\n\xff = 1\n"):
            f = self.file(".py", raw)
            self.add("encoding", "topology", ["up", f, "--id", "fz"], (f,))
        good = self.file(".py", GOOD_TOPO)
        d = self.root / "in" / "topodir.py"
        d.mkdir(exist_ok=True)
        for klass, path, names in (
            ("path", self.root / "in" / "missing.py", ("missing.py", "not found")),
            ("path", d, (str(d), "directory")),
            ("path", self.file(".txt", GOOD_TOPO), ("not a Python file",)),
            ("path", "", ("TOPOLOGY",)),
            ("path", " ", ("TOPOLOGY",)),
            ("path", "/dev/null", ("/dev/null",)),
        ):
            self.add(klass, "topology", ["up", path, "--id", "fz"], names)
        # --topo and -p
        self.add("empty", "topology", ["up", good, "--topo", ""], ("--topo",))
        self.add("unknown", "topology", ["up", good, "--topo", "nosuch"], ("--topo", "valid"))
        for p, names in (
            ("", ("-p",)),
            ("=1", ("-p",)),
            ("bw", ("-p",)),
            ("1x=2", ("-p",)),
            ("nosuch=1", ("nosuch",)),
            ("bw=fast", ("bw",)),
            ("bw=-1", ("bw",)),
            ("cpu=", ("-p", "cpu")),
        ):
            self.add("param", "topology", ["up", str(PI_PAIR), "-p", p, "--id", "fz"], names)
        self.add(
            "duplicate",
            "topology",
            ["up", str(PI_PAIR), "-p", "bw=10", "-p", "bw=20", "--id", "fz"],
            ("-p", "bw"),
        )
        # the same validation behind render and the board farm
        bad = self.file(".py", topo(ab + 'self.addLink(a, "ghost")'))
        self.add(
            "name", "topology", ["render", bad, "--vpn", "wireguard", "--out", self.out], (bad,)
        )
        self.add(
            "name", "topology", ["boards", "emulate", bad, "--out", self.out / "b.toml"], (bad,)
        )

    # --- VPN profiles and --vpn overrides: through `lab render` (and `lab up`)
    def vpn(self):
        specs = {
            "empty": ["", " ", ":", "wireguard:", "wireguard:mtu=", "wireguard:=5", ",,"],
            "type": ["wireguard:mtu=abc", "wireguard:mtu=1.5", "wireguard:mtu=true"],
            "range": ["wireguard:mtu=99999999", "wireguard:mtu=-1", "wireguard:mtu=0"],
            "unknown": ["nosuch", "wireguard:nokey=1", "wireguard:mtu"],
            "duplicate": ["wireguard:mtu=1280,mtu=1300"],
            "name": ["../etc/passwd", "wire guard", "WIREGUARD"],
            "unicode": ["wíreguard", "wireguard:mtu=１２８０"],
            "huge": ["w" * 5000, "wireguard:mtu=" + "9" * 5000],
        }
        for klass, items in specs.items():
            for s in items:
                self.add(
                    klass,
                    "vpn",
                    ["render", PI_PAIR, "--vpn", s, "--out", self.out / "r"],
                    ("--vpn",) if klass != "huge" else ("--vpn",),
                )
        for s in ("", "wireguard:mtu=-1", "nosuch"):
            self.add("empty" if not s else "range", "vpn", ["up", PI_PAIR, "--vpn", s], ("--vpn",))
        files = {
            "empty": ["", "   \n"],
            "syntax": ["driver = \n", "[params\n", 'driver = "wireguard'],
            "truncated": [GOOD_PROFILE[:10]],
            "unknown": ['driver = "nosuch"\n', GOOD_PROFILE + "colour = 1\n", 'drivr = "x"\n'],
            "type": [
                "driver = 5\n",
                GOOD_PROFILE + 'mtu = "big"\n',
                'driver = "wireguard"\nparams = 1\n',
            ],
            "range": [GOOD_PROFILE + "mtu = 1\n", GOOD_PROFILE + "mtu = 10000000000\n"],
            "duplicate": ['driver = "wireguard"\ndriver = "wireguard"\n'],
            "unicode": ['driver = "wíreguard"\n'],
        }
        for klass, items in files.items():
            for text in items:
                f = self.file(".toml", text)
                self.add(
                    klass, "vpn", ["render", PI_PAIR, "--vpn", f, "--out", self.out / "r"], (f,)
                )
        f = self.file(".toml", b'driver = "\xff"\n')
        self.add("encoding", "vpn", ["render", PI_PAIR, "--vpn", f, "--out", self.out / "r"], (f,))
        d = self.root / "in" / "dir.toml"
        d.mkdir(exist_ok=True)
        for path in (d, self.root / "in" / "missing.toml"):
            self.add(
                "path",
                "vpn",
                ["render", PI_PAIR, "--vpn", path, "--out", self.out / "r"],
                (str(path),),
            )
        # --out that cannot be a directory
        f = self.file(".txt", "x")
        self.add("path", "cli", ["render", PI_PAIR, "--vpn", "wireguard", "--out", f], ("--out",))

    # --- impairment specs: `lab up --impair` and `lab impair set` (refused before the lab)
    def impair(self):
        specs = {
            "empty": ["", " ", "a2b:", "a2b: ; b2a: delay 1ms", ";"],
            "type": ["delay abc", "loss x%", "rate fast", "delay 5", "limit 1.5"],
            "range": [
                "delay -5ms",
                "loss 200%",
                "loss -1%",
                "rate 0bit",
                "delay 99999999s",
                "limit 0",
                "jitter -1ms",
            ],
            "unknown": [
                "nonsense",
                "delay 5parsecs",
                "distribution nosuch",
                "delay 1ms frob 2",
                "ghost->b: delay 1ms",
            ],
            "duplicate": [
                "delay 10ms delay 20ms",
                "a2b: delay 1ms; a2b: delay 2ms",
                "loss 1% loss 2%",
            ],
            "unicode": ["délai 5ms", "delay 5ｍs", "delay 5ms\u00a0loss 1%"],
            "huge": ["delay " + "9" * 5000 + "ms", "delay 1ms " * 2000, "loss " + "1" * 400 + "%"],
        }
        for klass, items in specs.items():
            for s in items:
                self.add(
                    klass, "impair", ["up", PI_PAIR, "--impair", s, "--id", "fz"], ("--impair",)
                )
                words = [w for w in s.split(" ") if w] if s.strip() else [s]
                if not s.strip():
                    names, codes = ("SPEC",), (2,)
                elif "->" in s:  # node names in labels: only the lab knows its nodes
                    names, codes = ("no lab",), (3,)
                else:
                    names, codes = ("impair",), (2,)
                self.add(klass, "impair", ["impair", "set", "all", *words], names, codes)
        # negative numbers must reach the spec parser, not the argument parser
        self.add("range", "impair", ["impair", "set", "all", "delay", "-5ms"], ("delay", "-5ms"))
        self.add(
            "range", "impair", ["impair", "set", "--id", "fz", "all", "loss", "-1%"], ("loss",)
        )
        self.add(
            "precondition",
            "impair",
            ["impair", "set", "all", "delay", "5ms"],
            ("no lab",),
            codes=(3,),
        )
        self.add("precondition", "impair", ["impair", "show"], ("no lab",), codes=(3,))
        self.add("empty", "impair", ["impair", "set", "", "delay", "5ms"], ("TARGET",))
        self.add("range", "impair", ["up", PI_PAIR, "--placement", "nowhere"], ("--placement",))

    # --- plans and -o overrides: through `lab run`
    def plan(self):
        def mutate(old: str, new: str) -> str:
            assert old in QUICK, old
            return QUICK.replace(old, new, 1)

        #: quick.toml's value of each key a mutation below sets (the first line with the key)
        quick = {
            "name": '"quick"',
            "reps": "3",
            "duration_s": "5",
            "count": "20",
            "schema": "1",
            "rate_mbit": "100",
            "error_bars": '"sd"',
            "impairments": '["none", "network1"]',
            "file": '"topologies/pi_pair.py"',
            "cpu": '"pi4"',
            "test": '"tcp"',
        }
        #: the field a message names when the key's value is wrong
        field_of = {"file": "topology.file", "cpu": "topology.cpu", "test": "tests[0].test"}

        def setv(key: str, value: str, fld: str | None = None) -> tuple[str, str]:
            """quick.toml with `key = value` instead, and the field the message must name."""
            text = mutate(f"{key} = {quick[key]}", f"{key} = {value}")
            return text, fld or field_of.get(key, key)

        mutations = {
            "empty": [
                ("", "topology"),
                ("   \n", "topology"),
                setv("name", '""'),
                setv("name", '"  "'),
                (mutate("profiles = [", 'profiles = ["", '), "profiles"),
                setv("impairments", '[""]'),
                setv("impairments", "[]"),
                setv("file", '""'),
                setv("cpu", '""'),
                setv("test", '""'),
            ],
            "type": [
                setv("reps", '"3"'),
                setv("reps", "true"),
                setv("duration_s", '"long"'),
                (mutate("profiles = [", "profiles = [5, "), "profiles[0]"),
                setv("error_bars", "1"),
                (mutate("[topology]", "topology = 5\n[nottopology]"), "topology"),
                setv("count", '"many"'),
                setv("schema", "1.0"),
            ],
            "range": [
                *(setv("reps", v) for v in ("0", "-1", "1000000000")),
                *(setv("duration_s", v) for v in ("0", "1e9")),
                setv("rate_mbit", "-100"),
                setv("schema", "99"),
                setv("impairments", '["delay -5ms"]'),
            ],
            "duplicate": [
                (
                    mutate('profiles = ["baseline", ', 'profiles = ["baseline", "baseline", '),
                    "profiles",
                ),
                (mutate('name = "udp-100m"', 'name = "tcp"'), "tests"),
                setv("impairments", '["none", "none"]'),
                setv("reps", "3\nreps = 4", "line"),
            ],
            "unknown": [
                setv("reps", "3\ncolour = 1", "colour"),
                (mutate("profiles = [", 'profiles = ["nosuch", '), "profiles[0]"),
                setv("test", '"nosuch"'),
                setv("count", "20\nfrob = 1", "frob"),
                setv("cpu", '"z80"'),
                setv("impairments", '["nosuchpreset"]'),
            ],
            "name": [
                setv("name", '"../../etc"'),
                setv("name", '"a b"'),
                (mutate('name = "udp-100m"', 'name = "u/d"'), "tests[1].name"),
            ],
            "path": [
                setv("file", '"topologies/nosuch.py"'),
                setv("file", '"topologies"'),
                setv("file", '"/etc/passwd"', "topology"),
            ],
            "syntax": [
                (QUICK.replace("[topology]", "[topology"), "TOML"),
                (QUICK + "\nreps = = 1\n", "TOML"),
                ("schema = 1\nname = 'x\n", "TOML"),
            ],
            # cut mid-line: at half, and just after the last "=" (the file may end in comments)
            "truncated": [(QUICK[: len(QUICK) // 2], ""), (QUICK[: QUICK.rindex(" = ") + 2], "")],
            "huge": [
                setv("name", f'"{"q" * 5000}"'),
                setv("reps", f"{10**18}"),
                setv("duration_s", "inf"),
                setv("duration_s", "nan"),
                setv("file", f'"{"x" * 300}.py"'),
            ],
            "unicode": [setv("name", '"qüick"'), setv("test", '"tсp"')],
        }
        for klass, items in mutations.items():
            for text, fld in items:
                f = self.file(".toml", text)
                self.add(
                    klass, "plan", ["run", f, "--out", self.out / "run"], (f, fld) if fld else (f,)
                )
        for raw in (
            b"\xff\xfe" + QUICK.encode("utf-16-le"),
            QUICK.encode() + b"\n# \xe9\n",
            b"name = 'a\x00b'\n",
        ):
            f = self.file(".toml", raw)
            self.add("encoding", "plan", ["run", f, "--out", self.out / "run"], (f,))
        d = self.root / "in" / "plandir"
        d.mkdir(exist_ok=True)
        self.add("path", "plan", ["run", d, "--out", self.out / "run"], (str(d), "directory"))
        self.add(
            "path",
            "plan",
            ["run", "nosuchplan", "--out", self.out / "run"],
            ("nosuchplan", "not found"),
        )
        self.add("empty", "plan", ["run", "", "--out", self.out / "run"], ("PLAN",))
        self.add("path", "cli", ["run", "quick", "--out", self.file(".txt", "x")], ("--out",))
        self.add("path", "cli", ["run", "--resume", self.root / "in" / "noresume"], ("noresume",))
        f = self.file(".txt", "x")
        self.add("path", "cli", ["run", "--resume", f], (f,))
        overrides = {
            "empty": [
                ("", "-o"),
                ("reps=", "reps"),
                ("=5", "-o"),
                ("profiles=", "profiles"),
                ("impairments=", "impairments"),
                ("tests=", "tests"),
                (" ", "-o"),
            ],
            "type": [
                ("reps=abc", "reps"),
                ("vm=maybe", "vm"),
                ("duration=long", "duration"),
                ("reps=1.5", "reps"),
            ],
            "range": [
                ("reps=0", "reps"),
                ("duration=-1", "duration"),
                ("timeout_s=0", "timeout_s"),
                ("topology.params.bw=-1", "bw"),
                ("impairments=delay -5ms", "impairments"),
            ],
            "unknown": [
                ("nosuch=1", "nosuch"),
                ("reps", "-o"),
                ("profiles=nosuch", "profiles"),
                ("tests=ghost", "tests"),
                ("topology.x.y=1", "topology.x.y"),
                ("placement=nowhere", "placement"),
            ],
            "duplicate": [("profiles=wireguard,wireguard", "profiles")],
            "huge": [("reps=" + "9" * 400, "reps"), ("name=" + "n" * 5000, "name")],
            "unicode": [("réps=1", "réps"), ("profiles=wíreguard", "profiles")],
        }
        for klass, items in overrides.items():
            for text, fld in items:
                self.add(
                    klass,
                    "plan",
                    ["run", "quick", "-o", text, "--out", self.out / "run"],
                    ("-o", fld) if fld != "-o" else ("-o",),
                )
        self.add(
            "duplicate",
            "plan",
            ["run", "quick", "-o", "reps=1", "-o", "reps=2", "--out", self.out / "run"],
            ("-o", "reps"),
        )

    # --- lab ids: every command that takes --id
    def ids(self):
        bad = ["", " ", "UPPER", "1abc", "a" * 13, "a-b", "../x", "ñ", "a b", "a" * 5000, "-"]
        for lab_id in bad:
            klass = "empty" if not lab_id.strip() else "huge" if len(lab_id) > 100 else "name"
            for argv in (
                ["up", PI_PAIR, "--id", lab_id],
                ["down", "--id", lab_id],
                ["status", "--id", lab_id],
                ["exec", "--id", lab_id, "a", "--", "true"],
                ["impair", "show", "--id", lab_id],
                ["impair", "clear", "--id", lab_id],
                ["impair", "set", "--id", lab_id, "all", "delay", "5ms"],
                ["shell", "--id", lab_id, "a"],
                ["boards", "emulate", "--down", "--id", lab_id],
            ):
                if lab_id == "-" and argv[0] != "up":
                    continue  # argparse: "expected one argument" (also exit 2), once is enough
                self.add(klass, "id", [a if a != "--id" else "--id" for a in argv], ("--id",))
        # well-formed ids of labs that do not exist: conflict with this machine's state
        for argv in (
            ["status", "--id", "ghost"],
            ["exec", "--id", "ghost", "a", "--", "true"],
            ["impair", "show", "--id", "ghost"],
        ):
            self.add("missing", "id", argv, ("ghost",), codes=(2, 3))

    # --- node names and --map
    def nodes(self):
        for node in ("", " ", "../x", "a b", "ñ", "n" * 5000, "-"):
            klass = "empty" if not node.strip() else "huge" if len(node) > 100 else "name"
            if node == "-":
                continue
            self.add(klass, "node", ["exec", node, "--", "true"], ("NODE",))
            self.add(klass, "node", ["shell", node], ("NODE",))
        inv = self.file(".toml", GOOD_INVENTORY)
        for m, names in (
            ("", ("--map",)),
            ("client", ("--map",)),
            ("=pi-a", ("--map",)),
            ("client=", ("--map",)),
            ("client=pi-a", ()),
            ("ghost=pi-a", ("ghost",)),
        ):
            if m == "client=pi-a":
                continue
            self.add(
                "map", "node", ["up", PI_PAIR, "--boards", inv, "--map", m, "--id", "fz"], names
            )
        self.add(
            "duplicate",
            "node",
            [
                "up",
                PI_PAIR,
                "--boards",
                inv,
                "--map",
                "client=pi-a",
                "--map",
                "client=pi-b",
                "--id",
                "fz",
            ],
            ("--map", "client"),
        )

    # --- board inventories: `lab boards check` and `lab up --boards`
    def inventories(self):
        def pi_a(line: str) -> str:  # the good inventory with `line` added to board pi-a
            return GOOD_INVENTORY.replace("[boards.pi-a]", f"[boards.pi-a]\n{line}")

        def data(value: str) -> str:  # the good inventory with pi-a's data ports `value`
            return GOOD_INVENTORY.replace('data = ["eth1"]', f"data = {value}", 1)

        texts = {
            "empty": [
                "",
                "[boards]\n",
                GOOD_INVENTORY.replace('host = "192.0.2.21"', 'host = ""'),
                data("[]"),
            ],
            "type": [
                GOOD_INVENTORY.replace('mgmt = "eth0"', "mgmt = 5", 1),
                pi_a('port = "22"'),
                "boards = 5\n",
                'boards.pi-a = "x"\n',
            ],
            "range": [pi_a("port = 0"), pi_a("port = 70000")],
            "duplicate": [GOOD_INVENTORY + '\n[[cables]]\na = "pi-a:eth1"\nb = "pi-b:eth1"\n'],
            "unknown": [
                GOOD_INVENTORY + "colour = 1\n",
                pi_a("speed = 1"),
                GOOD_INVENTORY.replace('b = "pi-b:eth1"', 'b = "ghost:eth1"'),
            ],
            "syntax": ["[boards.pi-a\n", "boards = {\n"],
            "truncated": [GOOD_INVENTORY[:40]],
            "name": [
                data('["eth1/../x"]'),
                data(f'["{"e" * 40}"]'),
            ],
            "unicode": [GOOD_INVENTORY.replace("pi-a", "pï-a")],
            "huge": [f'ansible = "{"x" * 300}"\n', GOOD_INVENTORY.replace("pi-a", "p" * 300)],
        }
        for klass, items in texts.items():
            for text in items:
                f = self.file(".toml", text)
                self.add(klass, "inventory", ["boards", "check", f], (f,))
                self.add(klass, "inventory", ["up", PI_PAIR, "--boards", f, "--id", "fz"], (f,))
        f = self.file(".toml", b"[boards.\xff]\n")
        self.add("encoding", "inventory", ["boards", "check", f], (f,))
        d = self.root / "in" / "invdir.toml"
        d.mkdir(exist_ok=True)
        d2 = self.root / "in" / "invdir"
        d2.mkdir(exist_ok=True)
        for path in (d, d2, self.root / "in" / "missing.toml"):
            self.add("path", "inventory", ["boards", "check", path], (str(path),))
            self.add("path", "inventory", ["boards", "prepare", path, "--dry-run"], (str(path),))
        for text in texts["unknown"] + texts["syntax"]:
            f = self.file(".toml", text)
            self.add("unknown", "inventory", ["boards", "prepare", f, "--dry-run"], (f,))
        self.add("empty", "inventory", ["boards", "check", ""], ("INVENTORY",))

    # --- a path longer than the file system takes (ENAMETOOLONG), for every file argument
    def long_paths(self):
        long = "x" * 300
        for argv in (
            ["up", long + ".py"],
            ["render", PI_PAIR, "--vpn", long + ".toml", "--out", self.out / "r"],
            ["run", long],
            ["run", long + ".toml"],
            ["run", "quick", "--out", self.root / long],
            ["run", "--resume", long],
            ["boards", "check", long + ".toml"],
            ["up", PI_PAIR, "--boards", long + ".toml"],
            ["report", long],
            ["compare", long, long],
            ["import", long + ".csv", "--out", self.out / "imp"],
            ["render", PI_PAIR, "--vpn", "wireguard", "--out", self.root / long / "x"],
        ):
            self.add("huge", "path", argv, ("x" * 40,))

    # --- every command, also ones added after this file: an unknown option; and `lab check`,
    # `lab ci` with their own inputs
    def every_command(self):
        from lab.cli.main import COMMANDS

        for cmd in sorted(COMMANDS):
            # argparse names the option, or the arguments still missing before it
            self.add("argv", "cli", [cmd, "--no-such-option"], ("error:",))
        for text in ("", QUICK.replace("reps = 3", "reps = 0"), "[topology\n"):
            f = self.file(".toml", text)
            self.add("plan", "plan", ["check", f, "--out", self.out / "run"], (f,))
        missing = self.root / "in" / "norun"
        self.add("path", "cli", ["check", "--run", missing], ("norun",))
        self.add("path", "cli", ["check", "quick", "--baseline", missing], ("norun",))
        self.add("empty", "cli", ["check", "quick", "--baseline", ""], ("--baseline",))
        self.add("empty", "cli", ["ci", "init", ""], ("DIR",))
        self.add("path", "cli", ["ci", "init", self.file(".txt", "x")], ("f",))

    # --- argument vectors
    def cli(self):
        rng = self.rng
        vectors = [
            ([], ("COMMAND",)),
            (["nosuch"], ("nosuch",)),
            (["up"], ("topology",)),
            (["up", PI_PAIR, "--vm-mem", "abc"], ("--vm-mem",)),
            (["up", PI_PAIR, "--vm-mem", "-5"], ("--vm-mem",)),
            (["up", PI_PAIR, "--vm-mem", "0", "--vm"], ("--vm-mem",)),
            (["up", PI_PAIR, "--vm-mem", "99999999", "--vm"], ("--vm-mem",)),
            (["up", PI_PAIR, "--vm", "--boards", "x.toml"], ("--boards",)),
            (["up", PI_PAIR, "--impair-backend", "nosuch"], ("--impair-backend",)),
            (["up", PI_PAIR, "--frob"], ("--frob",)),
            (["run"], ("PLAN",)),
            (["run", "quick", "--vm-mem", "-1", "--vm"], ("--vm-mem",)),
            (["exec", "a"], ("lab exec",)),
            (["exec", "a", "--"], ("lab exec",)),
            (["impair"], ("ACTION",)),
            (["impair", "set"], ("target",)),
            (["impair", "set", "all"], ("SPEC",)),
            (["boards"], ("ACTION",)),
            (["boards", "emulate"], ("lab boards emulate",)),
            (["boards", "check"], ("inventory",)),
            (
                ["boards", "check", self.file(".toml", GOOD_INVENTORY), "--profiles", "nosuch"],
                ("--profiles",),
            ),
            (
                ["boards", "check", self.file(".toml", GOOD_INVENTORY), "--profiles", ""],
                ("--profiles",),
            ),
            (["report", self.root / "in" / "norun"], ("norun",)),
            (["report", self.root / "in" / "f-report.txt"], ("f-report.txt",)),
            (["compare", self.root / "in" / "a", self.root / "in" / "b"], ("a",)),
            (["import", self.root / "in" / "no.csv", "--out", self.out / "imp"], ("no.csv",)),
            (["import", self.file(".csv", b"\xff\xfe"), "--out", self.out / "imp"], ("csv",)),
            (["import", self.file(".csv", ""), "--out", self.out / "imp"], ("csv",)),
            (["calibrate", "nosuch"], ("nosuch",)),
            (["calibrate", ""], ("PROFILE",)),
            (["calibrate", "../x"], ("../x",)),
        ]
        for argv, names in vectors:
            self.add("argv", "cli", argv, names)
        # random word salad from the commands' own vocabulary: must never crash
        words = [
            "up",
            "run",
            "down",
            "status",
            "impair",
            "set",
            "--id",
            "--vpn",
            "--impair",
            "-o",
            "-p",
            "--out",
            "--",
            "",
            "-",
            "-5",
            "ñ",
            "all",
            "delay",
            "x" * 300,
        ]
        for _ in range(40):
            argv = [rng.choice(["up", "run", "status", "impair", "render", "boards", "exec"])]
            argv += [rng.choice(words) for _ in range(rng.randint(0, 6))]
            if argv[0] in ("up", "render"):
                argv.insert(1, str(self.root / "in" / "missing.py"))
            if argv[0] == "run":
                argv.insert(1, str(self.root / "in" / "missing.toml"))
            self.add("salad", "cli", argv, (), codes=(2, 3))


def generate(root: Path, seed: int = SEED) -> list[Case]:
    g = Gen(root, random.Random(seed))
    g.topology()
    g.vpn()
    g.impair()
    g.plan()
    g.ids()
    g.nodes()
    g.inventories()
    g.cli()
    g.long_paths()
    g.every_command()
    return g.cases


MUTATION_WORDS = [
    "",
    " ",
    "-1",
    "0",
    "None",
    "'x'",
    '""',
    "1e999",
    "ghost",
    "(",
    ":",
    "ñ",
    "[",
    "=",
    "\x00",
    "9" * 40,
    "True",
    "{",
    "#",
    "\n",
    "ms",
    "%",
    "-",
    "delay",
    "loss",
]


def _mutate(rng: random.Random, text: str) -> str:
    """One random edit of a valid file: truncate, delete, insert or replace a token."""
    i = rng.randrange(len(text))
    how = rng.randrange(4)
    if how == 0:
        return text[:i]
    if how == 1:
        return text[:i] + text[i + rng.randint(1, 20) :]
    if how == 2:
        return text[:i] + rng.choice(MUTATION_WORDS) + text[i:]
    tokens = text.split(" ")
    j = rng.randrange(len(tokens))
    tokens[j] = rng.choice(MUTATION_WORDS)
    return " ".join(tokens)


def generate_long(root: Path, seed: int = SEED, n: int = 500) -> list[Case]:
    """The long profile (`--long`): random mutations of valid files, specs and argument vectors.
    A mutation may be valid; then only "no traceback, no internal error" is asserted (the
    tripwire stops it before it builds anything)."""
    rng = random.Random(seed)
    g = Gen(root, rng)
    profile = (REPO / "vpn_profiles" / "wireguard.toml").read_text()
    spec_words = [
        "delay",
        "10ms",
        "5ms",
        "loss",
        "1%",
        "rate",
        "10mbit",
        "limit",
        "100",
        "duplicate",
        "corrupt",
        "reorder",
        "gap",
        "distribution",
        "normal",
        "a2b:",
        "b2a:",
        ";",
        "-5ms",
        "200%",
        "x",
        "1",
        "none",
        "network1",
        "seed",
        "ñ",
    ]
    for _ in range(n):
        kind = rng.choice(["topology", "plan", "vpn", "inventory", "impair", "cli"])
        if kind == "topology":
            f = g.file(".py", _mutate(rng, GOOD_TOPO))
            argv, names = ["up", f, "--id", "fz"], (f,)
        elif kind == "plan":
            f = g.file(
                ".toml", _mutate(rng, QUICK.replace("topologies/", str(REPO) + "/topologies/"))
            )
            argv, names = ["run", f, "--out", str(g.out / "run")], (f,)
        elif kind == "vpn":
            f = g.file(".toml", _mutate(rng, profile))
            argv, names = ["render", str(PI_PAIR), "--vpn", f, "--out", str(g.out / "r")], (f,)
        elif kind == "inventory":
            f = g.file(".toml", _mutate(rng, GOOD_INVENTORY))
            argv, names = ["boards", "check", f, "--profiles", "nosuch"], ()
        elif kind == "impair":
            words = [rng.choice(spec_words) for _ in range(rng.randint(1, 6))]
            argv = ["up", str(PI_PAIR), "--impair", " ".join(words), "--id", "fz"]
            names = ("--impair",)
        else:
            vocab = [
                "up",
                "run",
                "status",
                "impair",
                "set",
                "show",
                "--id",
                "--vpn",
                "-o",
                "-p",
                "--out",
                "--",
                "",
                "-",
                "-5",
                "ñ",
                "all",
                "delay",
                "fz",
                "x" * 300,
            ]
            argv = [rng.choice(["up", "run", "status", "impair", "render", "boards", "exec"])]
            argv += [rng.choice(vocab) for _ in range(rng.randint(0, 8))]
            names = ()
        codes = (0, 2, 3) if kind == "cli" else (2, 3)
        g.cases.append(Case(f"mutated-{kind}", kind, argv, names, codes, may_accept=True))
    return g.cases


# --------------------------------------------------------------------------- running


def _tree(*dirs: Path) -> set[str]:
    found = set()
    for d in dirs:
        if d.exists():
            found.add(str(d))
            for p in d.rglob("*"):
                found.add(str(p))
    return found


@contextlib.contextmanager
def tripwires():
    """Replace every function that creates something an input could reach with WouldCreate."""
    import lab.substrate.boards.farm as farm
    import lab.substrate.local.build as lablab
    import lab.campaign.runner as runner
    import lab.campaign.setup as runsetup
    import lab.core.state as state
    import lab.substrate.vm.lab as vmlab
    import lab.vpn.tunnel as tunnel
    from lab.substrate.boards import lab as boardlab

    def trip(what):
        def f(*a, **k):
            raise WouldCreate(what)

        return f

    patches = [
        (state, "create_lab_dir"),
        (lablab, "create_lab_dir"),
        (runner, "create_run_dir"),
        (runsetup, "create_run_dir"),
        (tunnel, "write_rendered"),
        (vmlab, "up"),
        (vmlab, "run_plan"),
        (boardlab, "up"),
        (farm, "emulate"),
    ]
    saved = [(m, n, getattr(m, n)) for m, n in patches if hasattr(m, n)]
    for m, n, _ in saved:
        setattr(m, n, trip(f"{m.__name__}.{n}"))
    try:
        yield
    finally:
        for m, n, f in saved:
            setattr(m, n, f)


def run_inprocess(argv: list[str]) -> tuple[int | str, str]:
    """lab.cli.main.main(argv) -> (exit code or 'created: ...', stderr)."""
    from lab.cli.main import main

    buf_err, buf_out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(buf_err), contextlib.redirect_stdout(buf_out):
        try:
            rc: int | str = main(list(argv))
        except SystemExit as e:  # argparse
            rc = e.code if isinstance(e.code, int) else 1
        except WouldCreate as e:
            rc = f"created: {e}"
        except BaseException:  # what the real entry point would print as a traceback
            rc = 1
            traceback.print_exc(file=buf_err)
    return rc, buf_err.getvalue()


def verdict(case: Case, rc, stderr: str, created: set[str]) -> str | None:
    """None when the case gave a clear error; else what was wrong."""
    if isinstance(rc, str):
        return None if case.may_accept and rc.startswith("created") else rc
    if "lab: internal error" in stderr:
        return stderr.strip().splitlines()[-1][:300]
    if "Traceback (most recent call last)" in stderr:
        return "traceback: " + stderr.strip().splitlines()[-1][:200]
    if created:
        return f"created {sorted(created)[:3]}"
    if rc not in case.codes:
        return f"exit {rc} (wanted {'/'.join(map(str, case.codes))}): {stderr.strip()[:200]}"
    missing = [n for n in case.names if n not in stderr]
    if missing and not (case.may_accept and rc != 2):
        return f"message does not name {missing}: {stderr.strip()[:300]}"
    return None


def run_all(cases: list[Case], root: Path) -> list[tuple[Case, str]]:
    watched = (root / "state", root / "run", root / "out", REPO / "runs")
    failures = []
    with tripwires():
        for case in cases:
            before = _tree(*watched)
            rc, stderr = run_inprocess(case.argv)
            created = _tree(*watched) - before
            bad = verdict(case, rc, stderr, created)
            if bad:
                failures.append((case, bad))
    return failures


@pytest.fixture
def fuzz_env(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("LAB_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.chdir(REPO)
    return tmp_path


def test_generator_covers_every_input_kind(tmp_path):
    cases = generate(tmp_path)
    kinds = Counter(c.kind for c in cases)
    assert set(kinds) == {
        "topology",
        "vpn",
        "impair",
        "plan",
        "id",
        "node",
        "inventory",
        "cli",
        "path",
    }
    assert len(cases) >= 400
    # seeded: the same inputs every time
    again = generate(tmp_path / "again")
    assert [(c.klass, len(c.argv)) for c in again] == [(c.klass, len(c.argv)) for c in cases]


#: commands without an input of their own to get wrong (`lab profiles`, `lab clean`)
NO_INPUT = {"profiles", "clean"}


def test_every_subcommand_is_fuzzed(tmp_path):
    from lab.cli.main import COMMANDS

    cases = generate(tmp_path)
    seen = {c.argv[0] for c in cases if c.argv}
    assert set(COMMANDS) - NO_INPUT <= seen
    assert {c.argv[1] for c in cases if c.argv[:1] == ["boards"] and len(c.argv) > 1} >= {
        "emulate",
        "check",
        "prepare",
    }
    assert {c.argv[1] for c in cases if c.argv[:1] == ["impair"] and len(c.argv) > 1} >= {
        "set",
        "show",
        "clear",
    }


def _write(tmp: Path, name: str, text: str | bytes) -> str:
    p = tmp / name
    p.write_bytes(text) if isinstance(text, bytes) else p.write_text(text)
    return str(p)


def _topo(body: str) -> str:
    lines = "".join(f"        {line}\n" for line in body.splitlines())
    return (
        "from mininet.topo import Topo\n\n\nclass T(Topo):\n    def build(self):\n"
        + lines
        + '\n\ntopos = {"t": T}\n'
    )


def issue_examples(tmp: Path) -> list[tuple[list[str], tuple[str, ...]]]:
    """The examples of issue 22, each: argv, what the message must name."""
    twice = _write(
        tmp, "twice.py", _topo('a = self.addHost("a")\nself.addHost("a")\nself.addLink(a, "a")')
    )
    ghost = _write(
        tmp,
        "ghost.py",
        _topo('a = self.addHost("a")\nb = self.addHost("b")\nself.addLink(a, "ghost")'),
    )
    exits = _write(tmp, "exits.py", "import sys\nsys.exit(0)\n")
    latin = _write(tmp, "latin.toml", QUICK.encode() + b"\n# caf\xe9\n")
    afile = _write(tmp, "afile", "x")
    tdir = tmp / "tdir.py"
    tdir.mkdir()
    pdir = tmp / "pdir"
    pdir.mkdir()
    return [
        (["up", str(PI_PAIR), "--impair", ""], ("--impair", "empty")),
        (["up", str(PI_PAIR), "--vpn", ""], ("--vpn", "empty")),
        (["up", str(PI_PAIR), "--id", ""], ("--id", "empty")),
        (["up", twice, "--id", "fz"], (twice, "host 'a'", "defined twice")),
        (["up", exits], (exits, "sys.exit(0)")),
        (["run", exits.replace(".py", ".toml")], ("not found",)),
        (["status", "--id", "nolab"], ("--id", "nolab")),
        (["status", "--id", "Bad-Id"], ("--id", "Bad-Id")),
        (["run", latin, "--out", str(tmp / "o")], (latin, "UTF-8")),
        (["run", "quick", "--out", afile], (afile, "--out", "not a directory")),
        (["up", ghost], (ghost, "ghost", "undefined node")),
        (["up", str(tdir)], (str(tdir), "directory")),
        (["run", str(pdir)], (str(pdir), "directory")),
        (["impair", "set", "all", "delay", "-5ms"], ("delay", "-5ms")),
    ]


def test_issue_examples(fuzz_env):
    """Every example of issue 22: exit 2, a message naming the input, nothing built."""
    with tripwires():
        for argv, names in issue_examples(fuzz_env):
            rc, stderr = run_inprocess(argv)
            assert rc == 2, (argv, rc, stderr)
            for n in names:
                assert n in stderr, (argv, n, stderr)
            assert "line 1" not in stderr or "topology.py" not in stderr


def test_debug_shows_the_traceback(fuzz_env):
    rc, stderr = run_inprocess(["--debug", "up", str(PI_PAIR), "--vpn", ""])
    assert rc == 2 and "Traceback (most recent call last)" in stderr and "--vpn" in stderr


def test_every_malformed_input_is_a_clear_error(fuzz_env):
    cases = generate(fuzz_env)
    failures = run_all(cases, fuzz_env)
    report = "\n".join(f"{c}\n    -> {why}" for c, why in failures)
    assert not failures, f"{len(failures)} of {len(cases)} inputs not a clear error:\n{report}"


def _netns() -> set[str]:
    try:
        cp = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {line.split()[0] for line in cp.stdout.splitlines() if line.strip()}


def test_real_entry_point_sample(fuzz_env):
    """A sample through `python -m lab.cli.main` itself: exit code, no traceback, named input,
    nothing created on this machine (state, run dirs, network namespaces)."""
    cases = generate(fuzz_env)
    rng = random.Random(SEED)
    sample = [c for c in cases if c.codes == (2,) and c.names and "\x00" not in "".join(c.argv)]
    by_kind: dict[str, list[Case]] = {}
    for c in sample:
        by_kind.setdefault(c.kind, []).append(c)
    picked = [rng.choice(v) for _, v in sorted(by_kind.items())]
    picked += [c for c in cases if c.argv[:3] == ["impair", "set", "all"] and "-5ms" in c.argv]
    picked += [
        c
        for c in cases
        if c.kind == "id" and c.argv[:3] == ["up", str(PI_PAIR), "--id"] and c.argv[3] == ""
    ]
    env = {
        **os.environ,
        "LAB_STATE_DIR": str(fuzz_env / "state"),
        "LAB_RUN_DIR": str(fuzz_env / "run"),
    }
    watched = (fuzz_env / "state", fuzz_env / "run", fuzz_env / "out", REPO / "runs")
    failures = []
    for case in picked:
        ns0, tree0 = _netns(), _tree(*watched)
        cp = subprocess.run(
            [sys.executable, "-m", "lab.cli.main", *case.argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=60,
        )
        # namespaces of the ids this case could have built (others' labs may come and go
        # on a shared machine meanwhile)
        ids = {"fz", "lab"} | {
            case.argv[i + 1] for i, a in enumerate(case.argv[:-1]) if a == "--id"
        }
        ours = {n for n in _netns() - ns0 if any(n.startswith(f"{i}-") for i in ids)}
        created = (_tree(*watched) - tree0) | {f"netns {n}" for n in ours}
        bad = verdict(case, cp.returncode, cp.stderr, created)
        if bad:
            failures.append(f"{case}\n    -> {bad}")
    assert not failures, "\n".join(failures)


def main() -> None:
    """Print inputs per class and how many were clear errors (the figures for issue 22)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        os.environ["LAB_STATE_DIR"] = str(root / "state")
        os.environ["LAB_RUN_DIR"] = str(root / "run")
        os.chdir(REPO)
        cases = generate(root)
        if "--long" in sys.argv:
            cases += generate_long(root / "long", n=3000)
        failures = run_all(cases, root)
    total = Counter(c.klass for c in cases)
    bad = Counter(c.klass for c, _ in failures)
    kinds = Counter(c.kind for c in cases)
    kbad = Counter(c.kind for c, _ in failures)
    print(f"{'class':<18}{'inputs':>8}{'clear':>8}")
    for k in sorted(total):
        print(f"{k:<18}{total[k]:>8}{total[k] - bad[k]:>8}")
    print(f"{'kind':<18}{'inputs':>8}{'clear':>8}")
    for k in sorted(kinds):
        print(f"{k:<18}{kinds[k]:>8}{kinds[k] - kbad[k]:>8}")
    print(f"{'all':<18}{len(cases):>8}{len(cases) - len(failures):>8}")
    if "-v" in sys.argv:
        for c, why in failures:
            print(f"{c}\n    -> {why}")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()


def _impair_state(lab_id: str) -> dict:
    from .conftest import run_lab

    r = run_lab("impair", "show", "--id", lab_id, "--json")
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    s = run_lab("status", "--id", lab_id, "--json")
    assert s.returncode == 0, s.stderr
    status = json.loads(s.stdout)[0]
    return {
        "requested": shown.get("requested"),
        "applied": shown.get("applied"),
        "vpn": (status.get("vpn") or {}).get("tunnel"),
        "nodes": sorted(status.get("nodes") or {}),
    }


@pytest.mark.root
def test_bad_impair_set_leaves_a_running_lab_unchanged(lab_id):
    """Through the real entry point on a lab that is up (impairment and, where WireGuard runs
    here, a tunnel): every bad `lab impair set` is exit 2 and changes nothing."""
    from lab.vpn.profiles import load_profile
    from lab.vpn.tunnel import availability

    from .conftest import TOPOS, lab_traces, run_lab

    vpn = ["--vpn", "wireguard"] if availability(load_profile("wireguard"))["ok"] else []
    topo = TOPOS / "pi_pair_middlebox.py"
    r = run_lab("up", topo, "--id", lab_id, "--impair", "delay 10ms", *vpn, timeout=180)
    assert r.returncode == 0, r.stderr
    before = _impair_state(lab_id)
    bad = [
        ["all", "delay", "-5ms"],
        ["all", "loss", "200%"],
        ["all", "delay", "5ｍs"],
        ["all", "nonsense"],
        ["all", "delay", "1ms", "delay", "2ms"],
        ["all", "a2b:"],
        ["all", ";"],
        ["all", ""],
        ["all", "ghost->server:", "delay", "1ms"],
        ["ghost", "delay", "1ms"],
        ["router:nosuch0", "delay", "1ms"],
        ["all", "delay", "9" * 500 + "ms"],
        ["all", "rate", "0bit"],
        ["all", "distribution", "nosuch"],
    ]
    failures = []
    for words in bad:
        cp = run_lab("impair", "set", "--id", lab_id, *words)
        if cp.returncode != 2 or "Traceback" in cp.stderr or "internal error" in cp.stderr:
            failures.append(f"{words[:4]}: exit {cp.returncode}: {cp.stderr.strip()[-300:]}")
    after = _impair_state(lab_id)
    assert run_lab("down", "--id", lab_id).returncode == 0
    assert lab_traces(lab_id) == []
    assert not failures, "\n".join(failures)
    assert after == before
