"""QEMU command lines for the lab VM, and the probe that picks KVM or TCG.

Pure argv construction lives here (unit-tested without QEMU); starting and stopping the process
is lab/substrate/vm/machine.py's job.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lab.core import proc
from lab.core.errors import PreconditionError
from lab.substrate.vm.initramfs import Entry, newc
from lab.substrate.vm.kernel import Kernel, cache_dir, find_kernel

QEMU = "qemu-system-x86_64"
QEMU_HINT = "apt-get install qemu-system-x86"
AGENT_PORT = "lab.agent"  # must match agent.PORT_NAME
#: virtio-serial ports the agent serves, each one host client at a time (QEMU's socket chardev
#: takes one connection): `lab shell` on a VM lab leaves the others to `lab impair`, `lab exec`...
#: Port i is named AGENT_PORT (i = 0) or AGENT_PORT.i; the guest finds each by name.
AGENT_PORTS = 4


def agent_port_name(i: int) -> str:
    return AGENT_PORT if i == 0 else f"{AGENT_PORT}.{i}"


ROOT_TAG = "labroot"
MSIZE = 512000  # the virtio transport's maximum in 6.x kernels (it clamps larger values)

#: Kernel command line. panic=-1 + QEMU's -no-reboot turn a guest panic into QEMU exiting, which
#: boot() notices at once instead of waiting for its timeout. tsc=reliable and no_timer_check
#: skip calibration loops that are slow under TCG; mitigations=off because the guest runs only
#: the lab's own code and the mitigations cost a lot of emulated time.
CMDLINE = (
    "console=ttyS0,115200 8250.nr_uarts=1 panic=-1 rdinit=/init loglevel=4 "
    "tsc=reliable no_timer_check mitigations=off random.trust_cpu=on"
)


@dataclass(frozen=True)
class Share:
    """A host directory exported over virtio-9p and mounted by the init at `guest_path`."""

    tag: str
    host_path: Path
    guest_path: str
    readonly: bool = False
    #: 9p cache mode in the guest: "loose" for trees the host does not change while the VM runs
    #: (fast), "mmap" for trees both sides write (writes reach the host at once).
    cache: str = "mmap"


def qemu_escape(value: str | Path) -> str:
    """QEMU option values are comma-separated: a literal comma is written twice."""
    return str(value).replace(",", ",,")


def require_qemu() -> str:
    found = proc.which(QEMU)
    if not found:
        raise PreconditionError(f"'{QEMU}' not found on PATH; {QEMU_HINT}")
    return found


def tcg_thread() -> str:
    """QEMU's TCG threading: "single" (one host thread runs every vCPU in turn) unless
    LAB_VM_TCG_THREAD=multi. Multi-threaded TCG races the guest kernel's live text patching
    (static keys go through int3 breakpoints): a vCPU runs a stale translation, hits an int3
    the kernel no longer has and the guest panics ("Oops: int3", or a RIP inside a 5-byte NOP),
    at boot or later, when a module load or a first use flips a static key. CI saw it twice in
    two runs; single-threaded TCG cannot race with itself."""
    v = os.environ.get("LAB_VM_TCG_THREAD", "single")
    if v not in ("single", "multi"):
        raise PreconditionError(f"LAB_VM_TCG_THREAD={v!r}: accepted values are single, multi")
    return v


def qemu_argv(
    *,
    qemu: str,
    kernel: Kernel,
    initramfs: Path,
    accel: str,
    mem_mb: int,
    cpus: int,
    console_log: Path,
    agent_sockets: Sequence[Path],
    pidfile: Path,
    shares: list[Share],
    cmdline: str = CMDLINE,
) -> list[str]:
    """The full QEMU argv: q35, no NIC, no display, serial console to a file, virtio-serial ports
    for the agent, one per socket (QEMU listens; it waits for a host on the first before the
    guest runs), and one virtio-9p device per share (the host root is always the first,
    read-only)."""
    accel_opt = f"tcg,thread={tcg_thread()}" if accel == "tcg" else accel
    e = qemu_escape
    argv = [
        qemu,
        "-name", "lab-vm",
        "-machine", "q35",
        "-cpu", "max",
        "-accel", accel_opt,
        "-m", str(mem_mb),
        "-smp", str(cpus),
        "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
        "-kernel", str(kernel.image),
        "-initrd", str(initramfs),
        "-append", cmdline,
        "-chardev", f"file,id=con,path={e(console_log)}",
        "-serial", "chardev:con",
        "-device", "virtio-serial-pci,id=vser",
        "-device", "virtio-rng-pci",
        "-pidfile", str(pidfile),
    ]  # fmt: skip
    for i, sock in enumerate(agent_sockets):
        cid, wait = ("agent", "on") if i == 0 else (f"agent{i}", "off")
        argv += [
            "-chardev", f"socket,id={cid},path={e(sock)},server=on,wait={wait}",
            "-device", f"virtserialport,bus=vser.0,chardev={cid},name={agent_port_name(i)}",
        ]  # fmt: skip
    for i, s in enumerate(shares):
        ro = ",readonly=on" if s.readonly else ""
        argv += [
            "-fsdev",
            f"local,id=fs{i},path={e(s.host_path)},security_model=none,multidevs=remap{ro}",
            "-device",
            f"virtio-9p-pci,fsdev=fs{i},mount_tag={s.tag}",
        ]
    return argv


# -- accelerator probe ---------------------------------------------------------------------------

PROBE_MARK = "LAB-ACCEL-PROBE-OK"
_PROBE_INIT = f"""#!/bin/busybox sh
/bin/busybox mount -t devtmpfs devtmpfs /dev 2>/dev/null
echo {PROBE_MARK} >/dev/console
/bin/busybox poweroff -f
"""


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def probe_accel(
    *, kernel: Kernel | None = None, timeout: float = 8.0, use_cache: bool = True
) -> str:
    """Return "kvm" if a KVM guest really boots the stock kernel to its init here, else "tcg".

    /dev/kvm existing proves nothing (on this project's CI hosts it is a hypervisor that cannot
    run stock kernels), so the probe boots the kernel with a three-line init under KVM and waits
    up to `timeout` s for its mark on the console. The answer is cached per host boot, kernel
    and QEMU binary in the kernel cache (accel-probe.json). LAB_VM_ACCEL=kvm|tcg overrides it.
    """
    forced = os.environ.get("LAB_VM_ACCEL")
    if forced in ("kvm", "tcg"):
        return forced
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    qemu = require_qemu()
    kernel = kernel or find_kernel()
    key = {"boot_id": _boot_id(), "kernel": kernel.release, "qemu": qemu,
           "qemu_mtime": os.stat(qemu).st_mtime_ns}  # fmt: skip
    cache_file = cache_dir() / "accel-probe.json"
    if use_cache:
        try:
            cached = json.loads(cache_file.read_text())
            if cached.get("key") == key and cached.get("accel") in ("kvm", "tcg"):
                return cached["accel"]
        except (OSError, ValueError):
            pass
    accel = "kvm" if _probe_kvm(qemu, kernel, timeout) else "tcg"
    try:
        tmp = cache_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": key, "accel": accel}))
        os.replace(tmp, cache_file)
    except OSError:
        pass  # a read-only cache only costs a probe per call
    return accel


def _probe_kvm(qemu: str, kernel: Kernel, timeout: float) -> bool:
    with tempfile.TemporaryDirectory(prefix="lab-kvm-probe-") as d:
        initrd = Path(d) / "initrd"
        initrd.write_bytes(
            newc([
                Entry("bin", stat.S_IFDIR | 0o755),
                Entry("dev", stat.S_IFDIR | 0o755),
                Entry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)),
                Entry("bin/busybox", stat.S_IFREG | 0o755, kernel.busybox.read_bytes()),
                Entry("init", stat.S_IFREG | 0o755, _PROBE_INIT.encode()),
            ])
        )  # fmt: skip
        console = Path(d) / "console"
        argv = [
            qemu, "-machine", "q35", "-cpu", "max", "-accel", "kvm", "-m", "256",
            "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
            "-kernel", str(kernel.image), "-initrd", str(initrd),
            "-append", "console=ttyS0 panic=-1 rdinit=/init loglevel=1",
            "-chardev", f"file,id=con,path={qemu_escape(console)}", "-serial", "chardev:con",
        ]  # fmt: skip
        p = proc.spawn(argv)
        deadline = time.monotonic() + timeout
        ok = False
        try:
            while time.monotonic() < deadline:
                if console.exists() and PROBE_MARK in console.read_text(errors="replace"):
                    ok = True
                    break
                if p.poll() is not None:
                    break
                time.sleep(0.05)
        finally:
            if p.poll() is None:
                p.kill()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        return ok
