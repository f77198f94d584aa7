"""Per-node cgroups: CPU caps and CPU accounting, on cgroup v2 or v1.

Every node gets a cgroup (the uncapped ones too): it is where the node's CPU time is accounted,
and it is the set of processes the lab started there, which teardown ends by PID.

v2: one directory <root>/lab/<labid>/<node> with cpu.max and cpuset.cpus.
v1: one directory per controller hierarchy (cpu, cpuacct, cpuset), same relative path,
    cpu.cfs_quota_us / cpu.cfs_period_us and cpuset.cpus/cpuset.mems.
The root is a parameter so the file-level behaviour of both versions is testable anywhere.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from lab.core.errors import PreconditionError

PERIOD_US = 100_000
V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset")


@dataclass(frozen=True)
class CgroupLayout:
    """Where the cgroup filesystems are. version is 1 or 2."""

    version: int
    root: Path  # v2: the cgroup2 mount; v1: the directory holding one mount per controller

    def dirs(self, rel: str) -> list[Path]:
        if self.version == 2:
            return [self.root / rel]
        return [self.root / c / rel for c in V1_CONTROLLERS]


def probe(root: Path = Path("/sys/fs/cgroup")) -> CgroupLayout:
    """Pick cgroup v2 when its cpu controller is usable, else v1 with cpu+cpuacct+cpuset."""
    candidates = [root, root / "unified"]
    for c in candidates:
        ctrl = c / "cgroup.controllers"
        if ctrl.is_file():
            have = set(ctrl.read_text().split())
            if {"cpu", "cpuset"} <= have:
                return CgroupLayout(2, c)
    if all((root / c / "cgroup.procs").is_file() for c in V1_CONTROLLERS):
        return CgroupLayout(1, root)
    raise PreconditionError(
        f"no usable cgroup CPU controller under {root}: need cgroup v2 with cpu+cpuset "
        "controllers or cgroup v1 with cpu, cpuacct and cpuset hierarchies"
    )


def all_cpus(layout: CgroupLayout) -> str:
    base = layout.root if layout.version == 2 else layout.root / "cpuset"
    for name in ("cpuset.cpus.effective", "cpuset.cpus"):
        p = base / name
        if p.is_file() and p.read_text().strip():
            return p.read_text().strip()
    return f"0-{(os.cpu_count() or 1) - 1}"


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def ensure_dir(layout: CgroupLayout, rel: str) -> None:
    """Create the cgroup `rel` in every hierarchy (idempotent) and make it usable."""
    if layout.version == 2:
        # a child only gets cpu.max/cpuset.cpus when its parent delegates the controllers
        parent = (layout.root / rel).parent
        have = (parent / "cgroup.controllers").read_text().split()
        enabled = (parent / "cgroup.subtree_control").read_text().split()
        want = [c for c in ("cpu", "cpuset") if c in have and c not in enabled]
        if want:
            _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in want))
    for d in layout.dirs(rel):
        try:
            d.mkdir()
        except FileExistsError:
            pass
        if layout.version == 1 and d.is_relative_to(layout.root / "cpuset"):
            # v1 cpuset: a new group starts with empty cpus/mems and refuses tasks until set.
            for f in ("cpuset.cpus", "cpuset.mems"):
                if not (d / f).read_text().strip():
                    _write(d / f, (d.parent / f).read_text().strip())


def set_cpu(
    layout: CgroupLayout,
    rel: str,
    cores: float | None,
    cpus: str | None = None,
    *,
    period_us: int = PERIOD_US,
) -> None:
    """Cap the group at `cores` host cores (None = no cap) and pin it to `cpus` (None = all).
    `period_us`: the CFS period the quota is handed out in (a time-dilated lab stretches it)."""
    quota = -1 if cores is None else max(1000, int(round(cores * period_us)))
    if layout.version == 2:
        d = layout.root / rel
        _write(d / "cpu.max", f"{'max' if quota < 0 else quota} {period_us}")
        if cpus is not None and (d / "cpuset.cpus").exists():
            _write(d / "cpuset.cpus", cpus)
    else:
        d = layout.root / "cpu" / rel
        _write(d / "cpu.cfs_period_us", str(period_us))
        _write(d / "cpu.cfs_quota_us", str(quota))
        if cpus is not None:
            _write(layout.root / "cpuset" / rel / "cpuset.cpus", cpus)


def slot_rel(rel: str, i: int) -> str:
    """The i-th per-core group of node group `rel` (lab/substrate/local/coreslots.py: one board core each)."""
    return f"{rel}/core{i}"


def slots_supported(layout: CgroupLayout) -> str | None:
    """None when per-thread caps (a thread moved alone into a capped child group) work here,
    else why not. cgroup v1 moves single threads through a group's `tasks` file; cgroup v2 needs
    threaded sub-groups, which the lab does not set up (yet)."""
    if layout.version == 1:
        return None
    return "cgroup v2: per-thread caps need threaded sub-groups, which the lab does not create yet"


def ensure_slot(
    layout: CgroupLayout,
    rel: str,
    i: int,
    cores: float,
    *,
    period_us: int = PERIOD_US,
    rel_of: str | None = None,
) -> str:
    """Create per-core group i of node group `rel` in the cpu hierarchy (v1), capped at `cores`
    host cores; returns its directory. Only the cpu controller has the groups: accounting
    (cpuacct) and placement (cpuset) stay per node. `rel_of`: the group's own path when it is
    not the i-th board core (a data plane's group, lab.substrate.local.dataplane)."""
    d = layout.root / "cpu" / (rel_of or slot_rel(rel, i))
    try:
        d.mkdir()
    except FileExistsError:
        pass
    _write(d / "cpu.cfs_period_us", str(period_us))
    _write(d / "cpu.cfs_quota_us", str(max(1000, int(round(cores * period_us)))))
    return str(d)


def thread_ids(group_dir: str) -> list[int]:
    """The threads (TIDs) in one v1 group (its `tasks` file); [] if it is gone."""
    try:
        return [int(x) for x in Path(group_dir, "tasks").read_text().split()]
    except FileNotFoundError:
        return []


def move_thread(group_dir: str, tid: int) -> bool:
    """Move one thread into a v1 group; False if the thread is gone."""
    try:
        _write(Path(group_dir) / "tasks", str(tid))
        return True
    except ProcessLookupError:
        return False
    except OSError as e:
        if e.errno == errno.ESRCH:
            return False
        raise


def procs_files(layout: CgroupLayout, rel: str) -> list[str]:
    return [str(d / "cgroup.procs") for d in layout.dirs(rel)]


def join(procs: list[str], pid: int = 0) -> None:
    """Move `pid` (0 = the calling process) into the group. Safe in a preexec_fn (no allocs of note)."""
    value = str(pid or os.getpid())
    for p in procs:
        fd = os.open(p, os.O_WRONLY)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)


def pids(layout: CgroupLayout, rel: str) -> list[int]:
    found: set[int] = set()
    for d in layout.dirs(rel):
        try:
            found.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        except FileNotFoundError:
            pass
    return sorted(found)


def usage(layout: CgroupLayout, rel: str) -> dict[str, float]:
    """CPU time used by the group so far, in seconds: total, user, system."""
    if layout.version == 2:
        stat = dict(
            line.split()
            for line in (layout.root / rel / "cpu.stat").read_text().splitlines()
            if line
        )
        return {
            "total": int(stat["usage_usec"]) / 1e6,
            "user": int(stat.get("user_usec", 0)) / 1e6,
            "system": int(stat.get("system_usec", 0)) / 1e6,
        }
    d = layout.root / "cpuacct" / rel
    total = int((d / "cpuacct.usage").read_text()) / 1e9
    out = {"total": total, "user": 0.0, "system": 0.0}
    for name, key in (("cpuacct.usage_user", "user"), ("cpuacct.usage_sys", "system")):
        p = d / name
        if p.is_file():
            out[key] = int(p.read_text()) / 1e9
    return out


def throttling(layout: CgroupLayout, rel: str) -> dict[str, int]:
    p = (
        (layout.root / rel / "cpu.stat")
        if layout.version == 2
        else (layout.root / "cpu" / rel / "cpu.stat")
    )
    try:
        return {k: int(v) for k, v in (line.split() for line in p.read_text().splitlines() if line)}
    except FileNotFoundError:
        return {}


def remove_dir(layout: CgroupLayout, rel: str, *, settle: float = 2.0) -> list[str]:
    """rmdir the group in every hierarchy; returns what could not be removed (with why).

    A group whose last process just exited can refuse rmdir (EBUSY) for a moment while the
    kernel finishes the exit (seen on cgroup v2): retry for up to `settle` seconds as long as
    no process is left in it.
    """
    left = []
    for d in reversed(layout.dirs(rel)):
        deadline = time.monotonic() + settle
        while True:
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as e:
                busy = e.errno in (errno.EBUSY, errno.ENOTEMPTY)
                has_children = any(c.is_dir() for c in d.iterdir())
                if (
                    busy
                    and not has_children
                    and not pids(layout, rel)
                    and time.monotonic() < deadline
                ):
                    time.sleep(0.02)
                    continue
                if busy:
                    left.append(f"cgroup {d} (busy: {pids(layout, rel) or 'child groups'})")
                else:
                    left.append(f"cgroup {d} ({e.strerror})")
                break
    return left
