"""Booting the lab VM: the shares it mounts, the initramfs and QEMU command line, waiting for
its agent, and starting once more after an emulator panic. lab.substrate.vm.machine is the VM once up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

from lab.core import proc
from lab.core.errors import PreconditionError, StartupError, TeardownIncomplete
from lab.substrate.vm.channel import Channel
from lab.substrate.vm.initramfs import build_initramfs
from lab.substrate.vm.kernel import Kernel, find_kernel
from lab.substrate.vm.machine import (
    AGENT_ARGV,
    DEFAULT_TMPFS,
    PANIC_LOGS,
    PROJECT_DIR,
    STATE_FILES,
    TCG_BOOT_RETRIES,
    VM,
    agent_socket_name,
    write_record,
    tail,
)
from lab.substrate.vm.qemu import (
    AGENT_PORTS,
    MSIZE,
    ROOT_TAG,
    Share,
    probe_accel,
    qemu_argv,
    require_qemu,
)


CACHE_MODES = ("loose", "mmap", "none")


def plan_shares(
    project_dir: Path | None,
    runs_dir: Path | None,
    shares: Mapping[str | Path, str | Path] | None,
    *,
    project_cache: str = "loose",
) -> list[Share]:
    """The host root (read-only, tag labroot) followed by the read-write shares: the project
    dir and the runs dir at their host paths, then `shares` ({guest_path: host_path}).

    Cache modes (see docs/vm.md): the root and, by default, the project dir are "loose" (the
    guest caches metadata and never revalidates: Python imports over 9p are 2-4x faster); the
    runs dir and extra shares are "mmap", so the host sees the guest's writes at once.
    """
    if project_cache not in CACHE_MODES:
        raise PreconditionError(f"project_cache={project_cache!r}: accepted values {CACHE_MODES}")
    planned = [Share(ROOT_TAG, Path("/"), "/", readonly=True, cache="loose")]
    wanted: dict[str, tuple[Path, str]] = {}
    if project_dir is not None:
        wanted[str(Path(project_dir).resolve())] = (Path(project_dir).resolve(), project_cache)
    if runs_dir is not None:
        wanted[str(Path(runs_dir).resolve())] = (Path(runs_dir).resolve(), "mmap")
    for guest, host in (shares or {}).items():
        wanted[str(guest)] = (Path(host).resolve(), "mmap")
    for i, (guest, (host, cache)) in enumerate(sorted(wanted.items())):  # parents first
        if not host.is_dir():
            raise PreconditionError(f"VM share {guest}: host directory {host} does not exist")
        if not guest.startswith("/") or any(c in guest for c in "|\n"):
            raise PreconditionError(f"VM share {guest!r}: guest path must be absolute, no '|'")
        planned.append(Share(f"labshare{i}", host, guest, cache=cache))
    return planned


def boot(
    state_dir: Path,
    *,
    mem_mb: int = 2048,
    cpus: int = 2,
    shares: Mapping[str | Path, str | Path] | None = None,
    project_dir: Path | None = PROJECT_DIR,
    runs_dir: Path | None = None,
    project_cache: str = "loose",
    accel: str | None = None,
    kernel: Kernel | None = None,
    cgroup: str = "v2",
    hostname: str = "lab-vm",
    timeout: float = 90.0,
    on_spawn: Callable[[dict], None] | None = None,
) -> VM:
    """Boot the lab VM and return once its agent answers.

    The host root is the guest's root (read-only 9p under a tmpfs overlay); `project_dir`,
    `runs_dir` (default: project_dir/runs if it exists) and `shares` ({guest_path: host_path})
    are mounted read-write. The project dir is cached in the guest (`project_cache="loose"`):
    host edits made while the VM runs may not be seen; pass "mmap" for coherence at 2-4x slower
    Python imports. `accel` defaults to probe_accel(). `cgroup` is "v2" (cgroup2 only,
    like users' machines) or "hybrid" (v1 cpu/cpuset/memory/pids + cgroup2 at
    /sys/fs/cgroup/unified, like this project's CI hosts).

    PreconditionError if QEMU or the kernel is missing; StartupError (with the console tail) if
    the guest does not come up within `timeout` s. A failed boot leaves only its logs behind.

    `on_spawn(record)` is called right after QEMU is started and vm.json written (pid, start
    time): a caller with its own ownership ledger records the QEMU process there (lab.substrate.vm.lab).
    """
    if cgroup not in ("v2", "hybrid"):
        raise PreconditionError(f"cgroup={cgroup!r}: accepted values are 'v2', 'hybrid'")
    qemu = require_qemu()
    kernel = kernel or find_kernel()
    accel = accel or probe_accel(kernel=kernel)
    if accel not in ("kvm", "tcg"):
        raise PreconditionError(f"accel={accel!r}: accepted values are 'kvm', 'tcg'")
    if runs_dir is None and project_dir is not None and (Path(project_dir) / "runs").is_dir():
        runs_dir = Path(project_dir) / "runs"
    planned = plan_shares(project_dir, runs_dir, shares, project_cache=project_cache)

    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    existing = state_dir / "vm.json"
    if existing.exists():
        old = VM.attach(state_dir)
        if old.alive():
            raise PreconditionError(f"a lab VM (pid {old.pid}) already runs from {state_dir}")
        old.shutdown()  # stale files of a VM that died: clear them before starting afresh
        state_dir.mkdir(parents=True, exist_ok=True)
    for name in STATE_FILES:
        (state_dir / name).unlink(missing_ok=True)

    config = {
        "LAB_KVER": kernel.release,
        "LAB_MODDIR": str(kernel.modules_dir),
        "LAB_MSIZE": str(MSIZE),
        "LAB_ROOT_CACHE": "loose",
        "LAB_SHARES": "\n".join(
            f"{s.tag}|{s.guest_path}|{'ro' if s.readonly else 'rw'}|{s.cache}" for s in planned[1:]
        ),
        "LAB_TMPFS": " ".join(DEFAULT_TMPFS),
        "LAB_CGROUP": cgroup,
        "LAB_HOSTNAME": hostname,
        "LAB_AGENT": AGENT_ARGV,
    }
    console = state_dir / "console.log"
    socks = [state_dir / agent_socket_name(i) for i in range(AGENT_PORTS)]
    panics: list[str] = []
    while True:
        state_dir.mkdir(parents=True, exist_ok=True)
        initramfs = build_initramfs(state_dir / "initramfs.cpio", kernel, config)
        argv = qemu_argv(
            qemu=qemu, kernel=kernel, initramfs=initramfs, accel=accel, mem_mb=mem_mb, cpus=cpus,
            console_log=console, agent_sockets=socks, pidfile=state_dir / "qemu.pid",
            shares=planned,
        )  # fmt: skip
        started = time.monotonic()
        with open(state_dir / "qemu.log", "wb") as qlog:
            popen = proc.spawn(argv, stderr=qlog, stdout=qlog)
        record = {
            "pid": popen.pid,
            "start_time": proc.proc_start_time(popen.pid),
            "accel": accel,
            "kernel": kernel.release,
            "kernel_image": str(kernel.image),
            "mem_mb": mem_mb,
            "cpus": cpus,
            "cgroup": cgroup,
            "shares": {s.guest_path: str(s.host_path) for s in planned[1:]},
            "agent_ports": AGENT_PORTS,
            "argv": argv,
            "boot_panics": panics,
        }
        write_record(state_dir, record)
        vm = VM(state_dir, record, popen)
        try:
            if on_spawn is not None:
                on_spawn(dict(record))
            _wait_ready(vm, started, timeout)
            break
        except BaseException as e:
            try:
                vm.shutdown(grace=0, keep_logs=True)
            except TeardownIncomplete:
                pass
            if not (isinstance(e, StartupError) and _emulator_panic(vm, accel, len(panics))):
                raise
            kept = state_dir / PANIC_LOGS[len(panics)]
            console.replace(kept)
            panics.append(kept.name)
    record["boot_seconds"] = round(time.monotonic() - started, 3)
    write_record(state_dir, record)
    return vm


def _emulator_panic(vm: VM, accel: str, retried: int) -> bool:
    """True if a failed boot is the emulator's, worth one more start.

    Under TCG with several vCPUs, QEMU can run a stale translation of kernel text the guest is
    patching (static keys go through int3 breakpoints), and the guest oopses on an int3 it no
    longer has there (seen in CI, rarely: "Oops: int3" in enqueue_timer, then "Kernel panic",
    1 s into boot). KVM runs the real CPU, so a panic there is the kernel's and is reported, as
    is any other panic (no init, a missing module: starting again cannot help). The panicked
    console log is kept (console-panicN.log) and listed in vm.json's boot_panics.
    """
    if accel != "tcg" or retried >= TCG_BOOT_RETRIES:
        return False
    try:
        console = vm.console_log.read_text(errors="replace")
    except OSError:
        return False
    return "Oops: int3" in console and "Kernel panic" in console


def _wait_ready(vm: VM, started: float, timeout: float) -> None:
    """Connect to QEMU's agent socket as soon as it exists (QEMU holds the guest until then),
    then wait for the agent's ready event, failing fast if QEMU exits."""
    deadline = started + timeout

    def failed(why: str) -> StartupError:
        qlog = tail(vm.state_dir / "qemu.log", 10)
        return StartupError(
            f"lab VM did not come up: {why}\n"
            f"--- QEMU stderr ({vm.state_dir / 'qemu.log'}) ---\n{qlog}\n"
            f"--- console tail ({vm.console_log}) ---\n{tail(vm.console_log)}"
        )

    while vm._channel is None:
        if not vm.alive():
            raise failed("QEMU exited before opening the agent socket")
        if time.monotonic() > deadline:
            raise failed(f"no agent socket after {timeout:.0f} s")
        if vm.agent_socket.exists():
            if vm._port_lock is None:
                vm._claim_port(deadline)  # port 0: nobody else knows this VM yet
            try:
                vm._channel = Channel(vm.agent_socket)
            except OSError:
                pass
        if vm._channel is None:
            time.sleep(0.02)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise failed(f"agent not ready after {timeout:.0f} s")
        if vm._channel.wait_event("ready", min(left, 0.25)) is not None:
            return
        if not vm.alive() or vm._channel.closed:
            raise failed("QEMU exited during boot (see the console tail)")
