"""A node's storage on this machine: an ext4 image on a loop device, mounted in the node's mount
namespace, with the block layer holding the device to a board's card rate.

Why these objects (docs/cpu.md "Storage"): cgroup v1 blkio limits on a node's group do not see
buffered writes, which the kernel's flusher threads (in the root group) write back. A loop
device of the node's own receives every write to its file system, whoever submits it, so a
per-device limit in the root blkio group (blkio.throttle.write_bps_device) holds all of them:
buffered writeback, journal, direct and synchronous I/O. How much a writer may dirty before it
waits is the loop device's backing-dev limit (/sys/class/bdi/MAJ:MIN: strict_limit with min =
max = the board's dirty limit, Linux 6.2+), so the host's own 24 GiB page cache does not hide
the card.

Ledger kinds (each line written before its object exists; teardown walks them backwards):
  storage-image   {path}                  the image file: deleted
  storage-loop    {image}                 loop devices backed by it: detached
  storage-mount   {mntns, target, image}  the mount inside the node: unmounted
  storage-limits  {image, dev, groups}    throttle rules (in those blkio groups) and bdi
                                          limits of dev: cleared
A loop device is found from its image path (its sysfs backing_file), never by its name.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from lab.core import proc
from lab.core.errors import CommandError

KINDS = ("storage-image", "storage-loop", "storage-limits", "storage-mount")
TOOLS = ("losetup", "mkfs.ext4", "nsenter", "mount", "umount")
LOOP_CONTROL = Path("/dev/loop-control")
SYS_BLOCK = Path("/sys/block")
SYS_BDI = Path("/sys/class/bdi")
SYS_DEV_BLOCK = Path("/sys/dev/block")
BLKIO_V1 = Path("/sys/fs/cgroup/blkio")
THROTTLE = {"write": "blkio.throttle.write_bps_device", "read": "blkio.throttle.read_bps_device"}
#: a Raspberry Pi OS root file system's options (/etc/fstab: defaults,noatime)
MOUNT_OPTS = "noatime"
#: the kernel's defaults of a backing device, restored at teardown
BDI_DEFAULTS = (("min_ratio", "0"), ("max_ratio", "100"), ("strict_limit", "0"))


def probe() -> tuple[str | None, str]:
    """(mechanism, why none): "loop+blkio-v1" when this machine can hold a node's writes to a
    rate, else None and the reason (the first missing piece)."""
    missing = [t for t in TOOLS if proc.which(t) is None]
    if missing:
        return None, f"missing tool(s): {', '.join(missing)} (util-linux, e2fsprogs)"
    if not LOOP_CONTROL.exists():
        return None, f"no loop device support ({LOOP_CONTROL} missing: CONFIG_BLK_DEV_LOOP)"
    if not (BLKIO_V1 / THROTTLE["write"]).is_file():
        return None, (
            f"no cgroup v1 blkio hierarchy with throttling ({BLKIO_V1 / THROTTLE['write']}: "
            "CONFIG_BLK_DEV_THROTTLING); the cgroup v2 io.max path is not implemented"
        )
    return "loop+blkio-v1", ""


# ---------------------------------------------------------------------- the objects


def create_image(path: Path, mib: int, files: dict[str, str] | None = None) -> None:
    """A sparse file of `mib` MiB holding a fresh ext4 (fails if `path` exists). The inode
    tables are written now, on the file, so no lazy-init thread later spends the card's rate on
    them (one inode per MiB keeps them small: a test writes few, large files); the journal needs
    no zeroing (lazy_journal_init: no thread zeroes it later either). `files` {name: text}
    are put at its root (mode 0600; the root itself 0700)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, mib * 1024 * 1024)
    finally:
        os.close(fd)
    with tempfile.TemporaryDirectory(prefix="lab-storage-") as root:
        for name, text in (files or {}).items():
            Path(root, name).write_text(text)
            os.chmod(Path(root, name), 0o600)
        _mkfs(path, root)


def _mkfs(path: Path, root: str) -> None:
    proc.run(
        [
            "mkfs.ext4",
            "-q",
            "-F",
            "-m",
            "0",
            "-i",
            "1048576",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=1",
            "-L",
            "lab-storage",
            "-d",
            root,
            str(path),
        ],
        timeout=120,
    )


def attach(image: Path) -> str:
    """Attach `image` to a free loop device; returns its path (/dev/loopN)."""
    return proc.run(["losetup", "--find", "--show", str(image)]).stdout.strip()


def loops_of(image: str | Path) -> list[str]:
    """The loop devices backed by `image` (sysfs backing_file; " (deleted)" when unlinked)."""
    found = []
    want = str(image)
    for d in sorted(SYS_BLOCK.iterdir()) if SYS_BLOCK.is_dir() else []:
        try:
            bf = (d / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue
        if bf.removesuffix(" (deleted)") == want:
            found.append(f"/dev/{d.name}")
    return found


def detach(dev: str) -> None:
    proc.run(["losetup", "--detach", dev], check=False)


def dev_t(dev: str) -> str:
    """The "MAJ:MIN" of a block device path."""
    rdev = os.stat(dev).st_rdev
    return f"{os.major(rdev)}:{os.minor(rdev)}"


def backed_by(devt: str, image: str) -> bool | None:
    """True: loop device `devt` is backed by `image`; None: it is free; False: someone else's."""
    try:
        bf = (SYS_DEV_BLOCK / devt / "loop" / "backing_file").read_text().strip()
    except FileNotFoundError:
        return None
    except OSError:
        return False
    return bf.removesuffix(" (deleted)") == image


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def blkio_groups(pid: int | str = "self") -> list[str]:
    """The blkio groups a rate rule must sit in: the root (the flusher threads' and jbd2's
    writeback) and, when it is not the root, the group of `pid`, whose children (the nodes'
    processes: the lab moves them only in the cpu hierarchies) write back in their own context
    on fsync, O_SYNC and O_DIRECT. A v1 hierarchy is flat for throttling: a rule in the root
    does not cover a child group's bios."""
    groups = ["/"]
    try:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            if "blkio" in ctrls.split(",") and path not in groups:
                groups.append(path)
    except OSError:
        pass
    return groups


def _group(group: str) -> Path:
    return BLKIO_V1 / group.lstrip("/")


def set_rate(devt: str, write_bps: int, read_bps: int | None, groups: list[str]) -> None:
    """Per-device limits in blkio `groups`: every bio to `devt` their members submit."""
    for g in groups:
        _write(_group(g) / THROTTLE["write"], f"{devt} {write_bps}")
        if read_bps:
            _write(_group(g) / THROTTLE["read"], f"{devt} {read_bps}")


def rates(devt: str, group: str = "/") -> dict[str, int]:
    """{"write": bps, "read": bps} of `devt`'s rules in blkio `group` (absent: no rule)."""
    out = {}
    for k, name in THROTTLE.items():
        try:
            lines = (_group(group) / name).read_text().split("\n")
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) == 2 and parts[0] == devt and int(parts[1]):
                out[k] = int(parts[1])
    return out


def clear_rate(devt: str, groups: list[str]) -> None:
    """Remove `devt`'s rules (a limit of 0 deletes a v1 rule); idempotent, a group gone is
    skipped."""
    for g in groups:
        for name in THROTTLE.values():
            try:
                _write(_group(g) / name, f"{devt} 0")
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.ENODEV):
                    raise


def set_dirty_limit(devt: str, limit_bytes: int) -> dict:
    """Hold the dirty pages of backing device `devt` at `limit_bytes` whatever the host's own
    limits (strict_limit: its writers throttle on the device's limits alone; min = max: the
    device's share of the global limit is exactly that, however busy the host's other disks
    are). Returns what the kernel reports back, or {"not_applied": why}."""
    bdi = SYS_BDI / devt
    if not (bdi / "max_bytes").is_file() or not (bdi / "strict_limit").is_file():
        return {"not_applied": f"{bdi} has no max_bytes/strict_limit (Linux < 6.2)"}
    # a loop device's bdi outlives the device: a minimum left by an earlier user, converted to a
    # ratio of the host's limit at that time, may now sit above this maximum (EINVAL): ours now
    _write(bdi / "min_ratio", "0")
    try:
        _write(bdi / "max_bytes", str(limit_bytes))
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        # the kernel converts bytes to a share of its current global dirty limit, over 100 % when
        # that limit is below `limit_bytes` (a host short of free memory)
        return {"not_applied": f"the kernel refused max_bytes={limit_bytes} on {bdi} ({e})"}
    try:
        _write(bdi / "min_bytes", str(limit_bytes))
    except OSError as e:
        # the two are converted to ratios of the host's current limit: rounding may put the
        # minimum a hair above the maximum
        if e.errno != errno.EINVAL:
            raise
        _write(bdi / "min_bytes", str(int(limit_bytes * 0.99)))
    _write(bdi / "strict_limit", "1")
    return {
        k: int((bdi / k).read_text().strip()) for k in ("max_bytes", "min_bytes", "strict_limit")
    }


def reset_dirty_limit(devt: str) -> None:
    bdi = SYS_BDI / devt
    if not bdi.is_dir():
        return
    for name, value in BDI_DEFAULTS:
        if (bdi / name).is_file():
            _write(bdi / name, value)


def dirty_limit_set(devt: str) -> bool:
    try:
        return (SYS_BDI / devt / "strict_limit").read_text().strip() == "1"
    except OSError:
        return False


def mount_in(mntns: Path, dev: str, target: str) -> None:
    """Mount `dev` on `target` inside the mount namespace whose handle is `mntns` only."""
    proc.run(
        ["nsenter", f"--mount={mntns}", "--", "mount", "-t", "ext4", "-o", MOUNT_OPTS, dev, target],
        where=f"mount namespace {mntns}",
    )


def mounted_in(mntns: Path, target: str) -> bool:
    """`target` is a mount point inside the namespace (False when the namespace is gone)."""
    try:
        r = proc.run(["nsenter", f"--mount={mntns}", "--", "cat", "/proc/self/mountinfo"])
    except (CommandError, OSError):
        return False
    return any(line.split()[4] == target for line in r.stdout.splitlines() if line.strip())


def umount_in(mntns: Path, target: str) -> None:
    if not mounted_in(mntns, target):
        return
    r = proc.run(["nsenter", f"--mount={mntns}", "--", "umount", target], check=False)
    if r.returncode != 0:  # busy: detach it now, the device goes with its last user
        proc.run(["nsenter", f"--mount={mntns}", "--", "umount", "-l", target], check=False)


# ---------------------------------------------------------------------- teardown


def remove(e: dict) -> None:
    """Undo one storage ledger line (lab.core.teardown, newest first); idempotent."""
    kind = e["kind"]
    if kind == "storage-mount":
        umount_in(Path(e["mntns"]), e["target"])
    elif kind == "storage-limits":
        # only while the device is still ours or free: a rule on someone else's device is theirs
        if backed_by(e["dev"], e["image"]) is not False:
            clear_rate(e["dev"], e.get("groups", ["/"]))
            reset_dirty_limit(e["dev"])
    elif kind == "storage-loop":
        for dev in loops_of(e["image"]):
            detach(dev)
    elif kind == "storage-image":
        Path(e["path"]).unlink(missing_ok=True)


def leftover(e: dict) -> list[str]:
    """What of one storage ledger line is still there."""
    kind = e["kind"]
    if kind == "storage-mount" and mounted_in(Path(e["mntns"]), e["target"]):
        return [f"mount {e['target']} in {e['mntns']}"]
    if kind == "storage-limits" and backed_by(e["dev"], e["image"]) is not False:
        left = [
            f"blkio throttle rule {e['dev']} {k} in {g}"
            for g in e.get("groups", ["/"])
            for k in rates(e["dev"], g)
        ]
        if dirty_limit_set(e["dev"]):
            left.append(f"strict dirty limit on {SYS_BDI / e['dev']}")
        return left
    if kind == "storage-loop":
        return [f"loop device {d} ({e['image']})" for d in loops_of(e["image"])]
    if kind == "storage-image" and Path(e["path"]).exists():
        return [f"storage image {e['path']}"]
    return []
