"""Remove exactly what a lab's ledger records, newest first, continuing past failures.

Works from the ledger alone (the topology file may be gone, the CLI that built the lab may have
been killed). Processes are ended by PID, verified by their recorded start time, and the node
cgroups' members (processes the lab started there) are ended before the cgroups go. Running it
twice is harmless: everything already gone is skipped.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

from lab.core import blockdev, cgroups, netops, proc
from lab.core.state import Ledger, lab_dir, run_root


def teardown(lab_id: str, notes: list[str] | None = None) -> list[str]:
    """Tear lab `lab_id` down. Returns a description of everything of the lab left over.

    `notes` collects what is not the lab's but worth saying: processes the lab did not start
    that still sit in one of its network namespaces (never signalled; the namespace lives on
    until they exit).
    """
    d = lab_dir(lab_id)
    ledger = Ledger(d / "ledger.jsonl")
    entries = ledger.entries()
    layout = None
    for e in entries:
        if e["kind"] == "lab":
            layout = cgroups.CgroupLayout(e["cgroup_version"], Path(e["cgroup_root"]))
    errors: list[str] = []

    # 1. processes recorded by PID (daemons), newest first
    stopped = {(e["pid"]) for e in entries if e["kind"] == "process-stopped"}
    for e in reversed(entries):
        if e["kind"] == "process" and e["pid"] not in stopped:
            try:
                if not proc.stop_pid(e["pid"], e.get("start_time"), grace=2.0):
                    errors.append(f"process {e['pid']} ({e.get('name')}) still running")
            except PermissionError as ex:
                errors.append(f"process {e['pid']}: {ex}")

    # 2. whatever else the lab started inside its nodes' cgroups (they joined before exec)
    if layout is not None:
        node_groups = [e["rel"] for e in entries if e["kind"] == "cgroup" and e.get("node")]
        _end_cgroup_members(layout, node_groups, errors)

    netns_inodes = {}
    for e in entries:
        if e["kind"] == "netns":
            try:
                netns_inodes[os.stat(f"/var/run/netns/{e['name']}").st_ino] = e["name"]
            except OSError:
                pass

    # 3. kernel objects, newest first
    for e in reversed(entries):
        try:
            _remove(e, layout, errors)
        except Exception as ex:  # keep going: report, never stop half-way
            errors.append(f"{e['kind']} {_desc(e)}: {type(ex).__name__}: {ex}")

    errors += leftovers(lab_id, entries, layout)
    if notes is not None and netns_inodes:
        notes.extend(_strangers(netns_inodes))
    errors = list(dict.fromkeys(errors))
    if not errors:
        shutil.rmtree(d, ignore_errors=True)
        # parents the lab created on first use go when no other lab needs them
        for parent in (run_root() / lab_id, run_root(), d.parent):
            try:
                parent.rmdir()
            except OSError:
                pass
    return errors


def _strangers(netns_inodes: dict[int, str]) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            ino = os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:
            continue
        if ino in netns_inodes:
            try:
                comm = open(f"/proc/{pid}/comm").read().strip()
            except OSError:
                comm = "?"
            found.append(
                f"process {pid} ({comm}), not started by the lab, still in the removed "
                f"namespace {netns_inodes[ino]}; it was left alone"
            )
    return found


def _desc(e: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in e.items() if k != "kind")


def _end_cgroup_members(layout, rels: list[str], errors: list[str]) -> None:
    pids = {p for rel in rels for p in cgroups.pids(layout, rel)}
    me = os.getpid()
    pids.discard(me)
    if not pids:
        return
    for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            for p in list(pids):
                try:
                    os.waitpid(p, os.WNOHANG)
                except ChildProcessError:
                    pass
            pids = {p for rel in rels for p in cgroups.pids(layout, rel)} - {me}
            if not pids:
                return
            time.sleep(0.02)
    errors.append(f"processes still in the lab's cgroups: {sorted(pids)}")


def _remove(e: dict, layout, errors: list[str]) -> None:
    kind = e["kind"]
    if kind == "mntns":
        netops.remove_node_mntns(Path(e["path"]))
    elif kind == "netns":
        netops.remove_netns(e["name"])
    elif kind == "veth":
        # lives inside the lab's namespaces (born there) and goes with them: nothing to do
        pass
    elif kind == "mntdir":
        p = Path(e["path"])
        netops.umount(str(p))
        if p.exists():
            for child in p.iterdir():  # handles of nodes whose mntns entry was never reached
                netops.umount(str(child))
                child.unlink(missing_ok=True)
            p.rmdir()
    elif kind == "cgroup" and layout is not None:
        if e.get("shared"):
            cgroups.remove_dir(layout, e["rel"])  # shared parent: removed only when empty
            return
        errors.extend(cgroups.remove_dir(layout, e["rel"]))
    elif kind in blockdev.KINDS:  # a node's storage: mount, rate limits, loop device, image
        blockdev.remove(e)
    elif kind == "hostveth":
        # the root-namespace end of a veth into one of the lab's namespaces (an emulated board
        # farm's management link): normally gone with that namespace already
        netops.remove_link(None, e["ifname"])
    # bridge, qdisc: live inside a namespace and go with it


def leftovers(lab_id: str, entries: list[dict], layout) -> list[str]:
    """Check every recorded object is really gone."""
    left = []
    for e in entries:
        k = e["kind"]
        if k == "netns" and netops.netns_exists(e["name"]):
            left.append(f"network namespace {e['name']}")
        elif k in ("mntns", "mntdir") and netops.is_mountpoint(e["path"]):
            left.append(f"mount {e['path']}")
        elif k == "cgroup" and layout is not None and not e.get("shared"):
            for dpath in layout.dirs(e["rel"]):
                if dpath.exists():
                    left.append(f"cgroup {dpath}")
        elif k in blockdev.KINDS:
            left += blockdev.leftover(e)
        elif k == "hostveth" and netops.link_exists(None, e["ifname"]):
            left.append(f"interface {e['ifname']} in the root namespace")
        elif k == "process" and proc.is_same_process(e["pid"], e.get("start_time")):
            left.append(f"process {e['pid']} ({e.get('name')})")
    return left
