"""`lab boards check` and `lab boards prepare`: what each board of an inventory is, whether the
lab and the chosen VPN profiles can run on it, and which Debian packages it lacks.

Everything is asked through the board's own node (lab.substrate.boards.node), as a lab run would ask:
the facts in ONE round trip (FACTS, a `sh -c` script), each profile with the same
lab.vpn.tunnel.availability() that `lab profiles` uses here (missing tools + Driver.check on the
board's kernel), each tool's version with its Tool.version argv. Boards are connected to in
parallel, one thread each; a board that cannot be reached is reported, the others still checked.

Nothing here changes a board except install() (`apt-get install`), which the CLI runs only after
listing the packages and asking (or --yes). Nothing prints: the CLI does.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.core.errors import LabError
from lab.core.hostreadings import parse_throttled
from lab.core.node import Node
from lab.core.tools import ETHTOOL, IP, NODE_TOOLS, PING, TC, Tool
from lab.measure.iperf3 import IPERF3
from lab.vpn.profiles import Profile
from lab.vpn.tunnel import availability
from lab.substrate.boards.impair import impairment_path
from lab.substrate.boards.readings import parse_measure_temp, throttled_words
from lab.substrate.boards.connection import BoardConnection
from lab.substrate.boards.node import BoardNode
from lab.substrate.boards.types import Board, Inventory

#: what the lab itself runs on every board besides the drivers' tools (measurements, link
#: set-up, impairment on a middlebox); `lab boards prepare` installs their packages too
LAB_TOOLS: tuple[Tool, ...] = (IP, TC, PING, IPERF3, ETHTOOL)
#: the argv and environment `lab boards prepare` installs packages with (apt-get(8))
APT_INSTALL = ("apt-get", "install", "-y", "--no-install-recommends")
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive"}

#: one round trip: every fact, each under `==> NAME <==` (a missing file or tool prints nothing)
FACTS = r"""
s() { echo; echo "==> $1 <=="; }
PATH="$PATH:/usr/sbin:/sbin:/usr/bin:/opt/vc/bin"
s uid; id -u
s model; tr -d '\000' < /proc/device-tree/model 2>/dev/null
s dmi; cat /sys/class/dmi/id/product_name 2>/dev/null
s serial; tr -d '\000' < /proc/device-tree/serial-number 2>/dev/null
s arch; uname -m
s kernel; uname -r
s os-release; cat /etc/os-release 2>/dev/null
s governor; cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null
s thermal; cat /sys/class/thermal/thermal_zone*/temp 2>/dev/null
if command -v vcgencmd >/dev/null; then
  s vcgencmd; command -v vcgencmd
  s get_throttled; vcgencmd get_throttled 2>&1
  s measure_temp; vcgencmd measure_temp 2>&1
fi
if command -v timedatectl >/dev/null; then
  s timedatectl; timedatectl show -p NTPSynchronized --value 2>&1
fi
if command -v chronyc >/dev/null; then
  s chronyc; chronyc -n tracking 2>&1
fi
exit 0
"""
_SECTION = re.compile(r"^==> (.*) <==$", re.M)


def parse_sections(text: str) -> dict[str, str]:
    parts = _SECTION.split(text)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}


def os_pretty_name(os_release: str) -> str | None:
    """PRETTY_NAME of an /etc/os-release (os-release(5): shell-style quoting)."""
    for line in os_release.splitlines():
        k, _, v = line.partition("=")
        if k.strip() == "PRETTY_NAME":
            return v.strip().strip("\"'") or None
    return None


def clock_sync(sections: dict[str, str]) -> tuple[str, str]:
    """("yes" | "no" | "unknown", how it was found out): timedatectl's NTPSynchronized, else
    chronyc tracking's Leap status, else unknown."""
    t = sections.get("timedatectl")
    if t in ("yes", "no"):
        return t, "timedatectl NTPSynchronized"
    c = sections.get("chronyc")
    if c:
        m = re.search(r"^Leap status\s*:\s*(.+)$", c, re.M)
        if m:
            synced = m.group(1).strip().lower() != "not synchronised"
            return ("yes" if synced else "no"), f"chronyc tracking: {m.group(1).strip()}"
    why = []
    if t is not None:
        why.append(f"timedatectl: {t.splitlines()[0] if t else 'no answer'}")
    if c is not None:
        why.append(f"chronyc: {c.splitlines()[0] if c else 'no answer'}")
    return "unknown", "; ".join(why) or "neither timedatectl nor chronyc on the board"


def parse_facts(text: str) -> dict[str, Any]:
    """FACTS' output -> the board's facts (each None when the board did not say)."""
    s = parse_sections(text)
    temps = [int(x) / 1000.0 for x in (s.get("thermal") or "").split() if re.fullmatch(r"-?\d+", x)]
    out: dict[str, Any] = {
        "root": s.get("uid") == "0",
        "uid": s.get("uid"),
        "model": s.get("model") or None,
        "model_source": "/proc/device-tree/model" if s.get("model") else None,
        "serial": s.get("serial") or None,
        "arch": s.get("arch") or None,
        "os": os_pretty_name(s.get("os-release") or ""),
        "kernel": s.get("kernel") or None,
        "governor": s.get("governor") or None,
        "temperature_c": max(temps) if temps else None,
        "temperature_source": "/sys/class/thermal" if temps else None,
        "throttled": None,
        "throttled_why": "vcgencmd not on PATH (not a Raspberry Pi)",
    }
    if not out["model"] and s.get("dmi"):
        out["model"], out["model_source"] = s["dmi"], "DMI product_name"
    if "vcgencmd" in s:
        try:
            t = parse_throttled(s.get("get_throttled") or "")
            out["throttled"] = {"raw": t["raw"], "words": throttled_words(t)}
            out["throttled_why"] = None
        except ValueError as e:
            out["throttled_why"] = str(e)
        try:
            out["temperature_c"] = parse_measure_temp(s.get("measure_temp") or "")
            out["temperature_source"] = "vcgencmd measure_temp"
        except ValueError:
            pass
    out["clock_sync"], out["clock_sync_source"] = clock_sync(s)
    return out


def board_tools(profiles: Iterable[Profile], *, node_tools: bool = False) -> list[Tool]:
    """The lab's own tools, then each profile's (Driver.tools(params) of its driver's
    requires), once each; with node_tools, the basic commands every node runs first."""
    out: dict[str, Tool] = {}
    for t in (*(NODE_TOOLS if node_tools else ()), *LAB_TOOLS):
        out.setdefault(t.name, t)
    for p in profiles:
        drv = p.driver
        wanted = set(drv.tools(p.params))
        for t in drv.requires:
            if t.name in wanted:
                out.setdefault(t.name, t)
    return list(out.values())


def tool_versions(node: Node, tools: list[Tool]) -> dict[str, dict]:
    """{tool key: {"name", "package", "present", "version"}} asked on the node: one round trip
    for presence, one per version command of a present tool (first line of its output)."""
    missing = set(node.missing_tools([t.name for t in tools]))
    out = {}
    for t in tools:
        rec: dict[str, Any] = {"name": t.name, "package": t.package,
                               "present": t.name not in missing, "version": None}  # fmt: skip
        if rec["present"] and t.version:
            try:
                cp = node.run(list(t.version), check=False, timeout=15)
                lines = (cp.stdout or cp.stderr or "").strip().splitlines()
                rec["version"] = lines[0].strip() if lines else None
            except LabError as e:
                rec["version_error"] = str(e).splitlines()[0]
        out[t.key] = rec
    return out


def missing_packages(node: Node, tools: list[Tool]) -> dict[str, list[str]]:
    """{Debian package: [its tools the node cannot execute]}, packages sorted by name. A tool
    counts as there when the node can run it, however it was installed."""
    missing = set(node.missing_tools([t.name for t in tools]))
    out: dict[str, list[str]] = {}
    for t in tools:
        if t.name in missing:
            out.setdefault(t.package, []).append(t.name)
    return dict(sorted(out.items()))


def install_argv(packages: Iterable[str]) -> list[str]:
    """The apt-get command `lab boards prepare` runs on a board (with APT_ENV)."""
    return [*APT_INSTALL, *packages]


def install(node: Node, packages: list[str], *, timeout: float = 1800) -> None:
    """Install `packages` on the node with apt-get (CommandError with apt's stderr tail)."""
    if packages:
        node.run(install_argv(packages), env=APT_ENV, timeout=timeout)


# ------------------------------------------------------------------------- sessions


@dataclass
class Session:
    """One board's connection for a check: its node, or why there is none."""

    board: Board
    node: BoardNode | None = None
    connect_s: float | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def connect_all(
    inventory: Inventory,
    log_dir: Path,
    *,
    connect_timeout: float = 20.0,
    then: Callable[[Session], None] | None = None,
) -> dict[str, Session]:
    """Connect to every board at once (a thread each), then run `then(session)` in the same
    thread for each board connected; errors of `then` go to session.error."""
    sessions = {name: Session(b) for name, b in inventory.boards.items()}

    def one(s: Session) -> None:
        t0 = time.monotonic()
        try:
            conn = BoardConnection.open(
                s.board,
                log_path=log_dir / f"ssh-{s.board.name}.log",
                connect_timeout=connect_timeout,
            )
        except (LabError, OSError) as e:
            s.error = str(e)
            return
        s.connect_s = time.monotonic() - t0
        s.node = BoardNode(s.board.name, conn)
        if then is not None:
            try:
                then(s)
            except (LabError, OSError, ValueError) as e:
                s.error = f"{type(e).__name__}: {e}"

    threads = [
        threading.Thread(target=one, args=(s,), name=f"board-{n}") for n, s in sessions.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sessions


def close_all(sessions: dict[str, Session]) -> None:
    for s in sessions.values():
        if s.node is not None:
            s.node.conn.close()


# ------------------------------------------------------------------------- check


def check_board(s: Session, profiles: list[Profile]) -> None:
    """Fill s.extra with the board's facts, each profile's availability and the tools."""
    node = s.node
    assert node is not None
    facts = parse_facts(node.run(["sh", "-c", FACTS], timeout=60).stdout)
    s.extra.update(facts)
    results = {}
    for p in profiles:
        try:
            results[p.name] = availability(p, {"client": node, "server": node})
        except LabError as e:
            results[p.name] = {"ok": False, "path": None, "why": str(e)}
    s.extra["profiles"] = results
    s.extra["impairment"] = impairment_path(node)
    s.extra["tools"] = tool_versions(node, board_tools(profiles))


def check(inventory: Inventory, profiles: list[Profile], log_dir: Path) -> list[dict]:
    """One record per board, in inventory order (the JSON of `lab boards check`)."""
    sessions = connect_all(inventory, log_dir, then=lambda s: check_board(s, profiles))
    try:
        return [_record(s) for s in sessions.values()]
    finally:
        close_all(sessions)


def _record(s: Session) -> dict:
    b = s.board
    return {
        "board": b.name,
        "host": b.host,
        "port": b.port,
        "user": b.user,
        "become": b.become,
        "reachable": s.node is not None,
        "connect_s": None if s.connect_s is None else round(s.connect_s, 3),
        "error": s.error,
        **({"root": False} if s.node is None else {}),
        **s.extra,
    }


def ready(records: list[dict]) -> bool:
    """Every board reachable, with root, and checked without error."""
    return all(r["reachable"] and r.get("root") and not r.get("error") for r in records)


# ------------------------------------------------------------------------- prepare


def prepare_plan(
    inventory: Inventory, profiles: list[Profile], log_dir: Path
) -> dict[str, Session]:
    """Connect to every board and find its missing packages (s.extra: "root", "packages"
    {package: [tools]}, "argv"). The sessions stay open for install(); close_all() them."""

    def one(s: Session) -> None:
        node = s.node
        assert node is not None
        s.extra["root"] = node.run(["id", "-u"], timeout=30).stdout.strip() == "0"
        pkgs = missing_packages(node, board_tools(profiles, node_tools=True))
        s.extra["packages"] = pkgs
        s.extra["argv"] = install_argv(pkgs) if pkgs else None

    return connect_all(inventory, log_dir, then=one)


def prepare_record(s: Session) -> dict:
    return {**_record(s), "env": APT_ENV if s.extra.get("argv") else None}


def install_all(sessions: dict[str, Session]) -> dict[str, str | None]:
    """Run each board's apt-get in parallel; {board: None (done) or the error}."""
    done: dict[str, str | None] = {}

    def one(name: str, s: Session) -> None:
        try:
            install(s.node, list(s.extra["packages"]))  # type: ignore[arg-type]
            done[name] = None
        except LabError as e:
            done[name] = str(e)

    todo = {n: s for n, s in sessions.items() if s.node is not None and s.extra.get("packages")}
    threads = [threading.Thread(target=one, args=(n, s)) for n, s in todo.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done
