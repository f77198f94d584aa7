"""Per-node cgroups: CPU caps and CPU accounting, on cgroup v2 or v1.

Every node gets a cgroup (the uncapped ones too): it is where the node's CPU time is accounted,
and it is the set of processes the lab started there, which teardown ends by PID.

v2: one directory <root>/lab/<labid>/<node> with cpu.max and cpuset.cpus.
v1: one directory per controller hierarchy (cpu, cpuacct, cpuset), same relative path,
    cpu.cfs_quota_us / cpu.cfs_period_us and cpuset.cpus/cpuset.mems.
A node's per-core groups (lab/substrate/local/coreslots.py) are children of its group: on v1 in
the cpu hierarchy only, on v2 threaded children (docs/cpu.md "cgroup v2"). Every operation on them
(ensure_slot, thread_ids, move_thread, pids) does what the hierarchy needs here, so callers never
ask which one they are on.
The root is a parameter (default: $LAB_CGROUP_ROOT, else /sys/fs/cgroup) so the file-level
behaviour of both versions is testable anywhere, and a cgroup2 mounted elsewhere can be used.
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
#: where the cgroup file systems are unless the caller says: a cgroup2 mounted elsewhere (the VM
#: test mounts one under a tmpfs) is used by pointing this at it
ROOT_ENV = "LAB_CGROUP_ROOT"


@dataclass(frozen=True)
class CgroupLayout:
    """Where the cgroup filesystems are. version is 1 or 2."""

    version: int
    root: Path  # v2: the cgroup2 mount; v1: the directory holding one mount per controller

    def dirs(self, rel: str) -> list[Path]:
        if self.version == 2:
            return [self.root / rel]
        return [self.root / c / rel for c in V1_CONTROLLERS]


def probe(root: Path | None = None) -> CgroupLayout:
    """Pick cgroup v2 when its cpu controller is usable, else v1 with cpu+cpuacct+cpuset.
    `root`: default $LAB_CGROUP_ROOT, else /sys/fs/cgroup."""
    if root is None:
        root = Path(os.environ.get(ROOT_ENV) or "/sys/fs/cgroup")
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


def _enable(d: Path, controllers: tuple[str, ...]) -> list[str]:
    """Enable `controllers` for the children of v2 group `d` (its cgroup.subtree_control);
    returns those `d` itself does not have (its parent does not delegate them)."""
    have = (d / "cgroup.controllers").read_text().split()
    enabled = (d / "cgroup.subtree_control").read_text().split()
    want = [c for c in controllers if c in have and c not in enabled]
    if want:
        _write(d / "cgroup.subtree_control", " ".join(f"+{c}" for c in want))
    return [c for c in controllers if c not in have]


def ensure_dir(layout: CgroupLayout, rel: str) -> None:
    """Create the cgroup `rel` in every hierarchy (idempotent) and make it usable."""
    if layout.version == 2:
        # a child only gets cpu.max/cpuset.cpus when its parent delegates the controllers
        _enable((layout.root / rel).parent, ("cpu", "cpuset"))
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


def cpu_dir(layout: CgroupLayout, rel: str) -> Path:
    """The directory of group `rel` that holds its CPU quota (v1: in the cpu hierarchy)."""
    return layout.root / rel if layout.version == 2 else layout.root / "cpu" / rel


def set_quota(
    layout: CgroupLayout, group_dir: Path, cores: float | None, period_us: int = PERIOD_US
) -> None:
    """Cap one group (its cpu_dir) at `cores` host cores per CFS period (None = no cap): v2
    `cpu.max` "QUOTA PERIOD", v1 cpu.cfs_period_us then cpu.cfs_quota_us."""
    quota = -1 if cores is None else max(1000, int(round(cores * period_us)))
    if layout.version == 2:
        _write(group_dir / "cpu.max", f"{'max' if quota < 0 else quota} {period_us}")
    else:
        _write(group_dir / "cpu.cfs_period_us", str(period_us))
        _write(group_dir / "cpu.cfs_quota_us", str(quota))


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
    set_quota(layout, cpu_dir(layout, rel), cores, period_us)
    if cpus is None:
        return
    if layout.version == 2:
        if (layout.root / rel / "cpuset.cpus").exists():
            _write(layout.root / rel / "cpuset.cpus", cpus)
    else:
        _write(layout.root / "cpuset" / rel / "cpuset.cpus", cpus)


#: a lab's CPU weight against the host's other work, as a multiple of the default (a nice-0 task
#: or a sibling group): cgroup v2's largest cpu.weight (10000 against 100), the same factor on v1
#: (cpu.shares 102400 against 1024); about nice -20's 87 (docs/cpu.md "The lab's CPU weight")
WEIGHT_FACTOR = 100
_DEFAULT_WEIGHT = {1: 1024, 2: 100}


def _weight_file(layout: CgroupLayout, rel: str) -> Path:
    return cpu_dir(layout, rel) / ("cpu.weight" if layout.version == 2 else "cpu.shares")


def weight(layout: CgroupLayout, rel: str) -> float | None:
    """Group `rel`'s CPU weight as a multiple of the default (None: no such group here)."""
    try:
        return int(_weight_file(layout, rel).read_text()) / _DEFAULT_WEIGHT[layout.version]
    except (FileNotFoundError, ValueError):
        return None


def set_weight(layout: CgroupLayout, rel: str, factor: float) -> None:
    _write(_weight_file(layout, rel), str(round(factor * _DEFAULT_WEIGHT[layout.version])))


def weigh_lab(layout: CgroupLayout, parent: str, rel: str, *, capped: bool) -> dict:
    """Give lab group `rel` (a child of the shared `parent`) WEIGHT_FACTOR when every host of
    the lab is capped, else the default, and the parent WEIGHT_FACTOR only while every group
    under it has it: a capped node then gets its quota whenever it is runnable, as a board's
    cores are its own, while host work it competes with still gets what the caps leave; an
    uncapped host (cpu = host speed) never runs above the host's other work. What was set and
    which sibling groups held the parent back, for lab.json."""
    mine = WEIGHT_FACTOR if capped else 1
    set_weight(layout, rel, mine)
    held = sorted(
        d.name
        for d in cpu_dir(layout, parent).iterdir()
        if d.is_dir() and (weight(layout, f"{parent}/{d.name}") or 0) < WEIGHT_FACTOR
    )
    set_weight(layout, parent, 1 if held else WEIGHT_FACTOR)
    return {
        "file": _weight_file(layout, rel).name,
        "lab": mine,
        "parent": 1 if held else WEIGHT_FACTOR,
        "held_back_by": held,
    }


def slot_rel(rel: str, i: int) -> str:
    """The i-th per-core group of node group `rel` (lab/substrate/local/coreslots.py: one board
    core each)."""
    return f"{rel}/core{i}"


#: slots_supported's answer per cgroup root, probed once per process
_SLOTS_PROBED: dict[Path, str | None] = {}


def slots_supported(layout: CgroupLayout) -> str | None:
    """None when per-thread caps (a thread moved alone into a capped child group) work here,
    else why not. cgroup v1 moves single threads through a group's `tasks` file. cgroup v2 needs
    threaded children with the cpu controller (kernel >= 4.15), which a kernel or a delegation
    may refuse: tried once, for real, on a transient group (_try_threaded)."""
    if layout.version == 1:
        return None
    if layout.root not in _SLOTS_PROBED:
        _SLOTS_PROBED[layout.root] = _try_threaded(layout)
    return _SLOTS_PROBED[layout.root]


def _try_threaded(layout: CgroupLayout) -> str | None:
    """Create `<root>/lab-threaded-probe-<pid>` with a capped threaded child, as ensure_slot
    would for a node, and remove both at once (in a finally, by their paths); the refusal, or
    None. Probed under the root, beside where labs go: the root is where ensure_dir enables the
    cpu controller for every lab anyway."""
    rel = f"lab-threaded-probe-{os.getpid()}"
    made: list[Path] = []
    step = "create the probe group"
    try:
        ensure_dir(layout, rel)
        made.append(layout.root / rel)
        step = "make a threaded child with cpu.max"
        child = cpu_dir(layout, slot_rel(rel, 0))
        made.append(child)
        ensure_slot(layout, rel, 0, 0.5)
        if (child / "cgroup.type").read_text().strip() != "threaded":
            return f"cgroup v2: {child} did not become threaded"
        return None
    except (OSError, PreconditionError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return f"cgroup v2: the kernel refused per-thread groups ({step}: {why})"
    finally:
        for d in reversed(made):
            try:
                d.rmdir()
            except FileNotFoundError:
                pass


def ensure_slot(
    layout: CgroupLayout,
    rel: str,
    i: int,
    cores: float,
    *,
    period_us: int = PERIOD_US,
    rel_of: str | None = None,
) -> str:
    """Create per-core group i of node group `rel`, capped at `cores` host cores; returns its
    directory. Idempotent. `rel_of`: the group's own path when it is not the i-th board core (a
    data plane's group, lab.substrate.local.dataplane), a child of `rel` too.

    v1: a child in the cpu hierarchy only; accounting (cpuacct) and placement (cpuset) stay per
    node. v2: a threaded child (`cgroup.type` = threaded): the node group enables the cpu
    controller for its children and becomes their threaded domain, whose cpuset and cpu.stat
    cover them; the threads of one process may then sit in different children, but never leave
    the node's subtree (cgroup-v2.rst, "Threads"). Only threaded controllers (cpu, cpuset, pids,
    perf_event) work there, so the node group enables nothing else for its children."""
    group = rel_of or slot_rel(rel, i)
    d = cpu_dir(layout, group)
    if layout.version == 2:
        parent = d.parent
        if _enable(parent, ("cpu",)):
            raise PreconditionError(
                f"cgroup {parent}: no cpu controller to give its per-core groups (its parent's "
                "cgroup.subtree_control lacks +cpu)"
            )
    try:
        d.mkdir()
    except FileExistsError:
        pass
    if layout.version == 2 and (d / "cgroup.type").read_text().strip() != "threaded":
        # one way only, and only while the group is empty: right after mkdir
        _write(d / "cgroup.type", "threaded")
    set_quota(layout, d, cores, period_us)
    return str(d)


def _threads_file(group_dir: str | Path) -> Path:
    """The file that lists a group's threads and moves one thread in: v1 `tasks`, v2
    `cgroup.threads` (a v1 group has no cgroup.threads, a v2 group no tasks)."""
    d = Path(group_dir)
    return d / "tasks" if (d / "tasks").exists() else d / "cgroup.threads"


def thread_ids(group_dir: str) -> list[int]:
    """The threads (TIDs) directly in one group, v1 or v2; [] if it is gone."""
    try:
        return [int(x) for x in _threads_file(group_dir).read_text().split()]
    except FileNotFoundError:
        return []


def node_threads(layout: CgroupLayout, rel: str) -> list[int]:
    """Every thread of node group `rel`, wherever in it: v1 its cpuacct group's `tasks` (the
    per-core groups exist in the cpu hierarchy only), v2 `cgroup.threads` of the group and of
    each child group (its threaded per-core groups). FileNotFoundError when the group is gone."""
    if layout.version == 1:
        return [int(x) for x in (layout.root / "cpuacct" / rel / "tasks").read_text().split()]
    d = layout.root / rel
    tids = [int(x) for x in (d / "cgroup.threads").read_text().split()]
    for child in sorted(c for c in d.iterdir() if c.is_dir()):
        tids += thread_ids(str(child))
    return tids


def move_thread(group_dir: str, tid: int) -> bool:
    """Move one thread into a group, v1 or v2; False if the thread is gone. On v2 the thread's
    process must already be in the group's threaded domain (the node group or one of its
    threaded children): else the kernel refuses (EOPNOTSUPP), raised as OSError."""
    try:
        _write(_threads_file(group_dir), str(tid))
        return True
    except ProcessLookupError:
        return False
    except OSError as e:
        if e.errno == errno.ESRCH:
            return False
        raise


def procs_files(layout: CgroupLayout, rel: str) -> list[str]:
    return [str(d / "cgroup.procs") for d in layout.dirs(rel)]


def procs_file(group_dir: str) -> str:
    """The file a whole process enters one group through (join), a node's per-core group
    included: `cgroup.procs` on v1 and v2 alike. On v2 it moves every thread of the process,
    and a process from anywhere may enter a threaded group this way (only single threads are
    held to their threaded domain)."""
    return str(Path(group_dir, "cgroup.procs"))


def join(procs: list[str], pid: int = 0) -> None:
    """Move `pid` (0 = the calling process) into the group. Safe in a preexec_fn (no allocs of note)."""
    value = str(pid or os.getpid())
    for p in procs:
        fd = os.open(p, os.O_WRONLY)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)


def tgid_of(tid: int) -> int | None:
    """The process (thread group) thread `tid` belongs to, None when it is gone."""
    try:
        with open(f"/proc/{tid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def pids(layout: CgroupLayout, rel: str) -> list[int]:
    """The processes with a thread in group `rel` (a v2 node group: in its threaded children
    too, as the kernel lists them in the threaded domain's cgroup.procs)."""
    found: set[int] = set()
    for d in layout.dirs(rel):
        try:
            found.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        except FileNotFoundError:
            pass
        except OSError as e:
            # a v2 threaded group refuses to list processes (they belong to its domain)
            if e.errno != errno.EOPNOTSUPP:
                raise
            found.update(p for t in thread_ids(str(d)) if (p := tgid_of(t)) is not None)
    return sorted(found)


def cgroup_record(layout: CgroupLayout, *, slots: int, refused: str | None = None) -> str:
    """How a node's CPU model is built here, for its cpu record in lab.json: "v1" (per-core
    groups, if any, in the cpu hierarchy), "v2-threaded" (threaded per-core groups), "v2" (no
    per-core groups asked for), "v2-one-core" (asked for, refused by the kernel: `refused`,
    the node gets one board core)."""
    if layout.version == 1:
        return "v1"
    if refused:
        return "v2-one-core"
    return "v2-threaded" if slots else "v2"


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
    p = cpu_dir(layout, rel) / "cpu.stat"
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
