"""A lab inside the full-kernel VM: `lab up --vm` on the host, the same `lab up` in the guest.

The host keeps a small lab of its own under /var/lib/lab/<id>/ so that the ordinary host
commands find it and `lab down` / `lab clean` remove it:

    ledger.jsonl   "vm-lab" (first line, marks the lab as a VM lab), then "process-intent" and
                   "process" for QEMU (pid + start time, written right after the spawn): the
                   teardown conventions of lab.core.teardown stop QEMU by PID even when the CLI that
                   booted it was killed
    lab.json       id, state, substrate (kernel, accelerator, what the figures are evidence of),
                   the VM record, the arguments given to the guest's `lab up` and its status
    vm/            the VM's state directory (lab.substrate.vm: vm.json, console.log, agent.sock, ...)
    share/         files the guest must read that sit where the guest has its own tmpfs (a
                   topology in /tmp, ...): copied here, mounted at /mnt/lab-host in the guest

Inside the guest the lab is an ordinary lab with the same id (the guest's /var/lib/lab is its
own tmpfs). Host commands reach it by running `python -m lab.cli.main ...` in the guest through the
VM's agent (one port per concurrent host command, four in all). The project directory
and its runs/ share are the same paths inside and out, so results written under runs/ in the
guest are on the host at once.
"""

from __future__ import annotations

from lab import REPO
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from lab.core.errors import (
    CommandError,
    ConfigError,
    LabError,
    PreconditionError,
    StartupError,
    TeardownIncomplete,
)
from lab.core.state import (
    Ledger,
    check_id,
    create_lab_dir,
    lab_dir,
    list_lab_ids,
    new_lab_id,
    write_json_atomic,
)
from lab.substrate.vm import boot
from lab.core.teardown import teardown
from lab.core import netops
from lab.substrate.vm import find_kernel
from lab.substrate.vm.qemu import require_qemu
from lab.substrate.vm.terminal import attach
from lab.substrate.vm import VM
from lab.core.proc import is_same_process
from lab.vpn.tunnel import prepare
from lab.impair.runtime import plan_for

PROJECT = REPO
#: where the guest mounts the host lab's share/ directory
GUEST_SHARE = "/mnt/lab-host"
#: directories that are a private tmpfs in the guest (lab.substrate.vm.machine.DEFAULT_TMPFS + /run):
#: a host file under one of them is invisible inside and is copied to share/
GUEST_PRIVATE = ("/tmp", "/run", "/var/run", "/var/lib/lab", "/var/log", "/var/tmp")
UP_TIMEOUT = 900.0
FORWARD_TIMEOUT = float(os.environ.get("LAB_VM_FORWARD_TIMEOUT", "3600"))
TCG_NOTE = (
    "functional evidence only: QEMU TCG emulates the CPU in software, so throughput, "
    "latency and CPU figures measured in this lab say nothing about a board or a laptop"
)


def _entries(lab_id: str) -> list[dict]:
    return Ledger(lab_dir(lab_id) / "ledger.jsonl").entries()


def is_vm_lab(lab_id: str | None) -> bool:
    if not lab_id:
        return False
    entries = _entries(lab_id)
    return bool(entries) and entries[0].get("kind") == "vm-lab"


def resolve(lab_id: str | None) -> str | None:
    """The id of the VM lab a host command names (or, without --id, the only lab up), else None."""
    if lab_id:
        return check_id(lab_id) if is_vm_lab(lab_id) else None
    ids = list_lab_ids()
    return ids[0] if len(ids) == 1 and is_vm_lab(ids[0]) else None


def vm_substrate(vm) -> dict:
    """What the lab runs on, for lab.json, `lab status` and run manifests."""
    return {
        "kind": "vm",
        "kernel": vm.kernel_release,
        "accelerator": vm.accel,
        "evidence": "functional" if vm.accel == "tcg" else "performance",
        "note": TCG_NOTE if vm.accel == "tcg" else "KVM: near-native speed",
        "host_kernel": os.uname().release,
        "qemu_pid": vm.pid,
        "boot_s": vm.boot_seconds,
        # guest boots that panicked in the emulator and were started again (lab.substrate.vm.machine)
        "boot_panics": len(vm.record.get("boot_panics") or ()),
    }


def guest_path(path: str | Path, share: Path) -> str:
    """`path` as the guest sees it: the same path, unless it sits where the guest has a private
    tmpfs; then it is copied into `share` (mounted at GUEST_SHARE)."""
    p = Path(path).resolve()
    if not any(p == Path(d) or Path(d) in p.parents for d in GUEST_PRIVATE):
        return str(p)
    share.mkdir(mode=0o700, exist_ok=True)
    shutil.copy2(p, share / p.name)
    return f"{GUEST_SHARE}/{p.name}"


def preflight(spec, vpn: str | None, impair: str | None, placement: str | None) -> None:
    """Host-side checks before a VM is booted: the profile and impairment are valid for the
    topology, the tools exist (the guest runs the host's root), an L2 technology has its two
    ends on one segment. Kernel features are not checked here: the guest has them."""
    if vpn:
        prepare(spec, vpn, kernel=False)
    if impair is not None:
        plan_for(spec, placement, impair, "kernel-netem", "")


def _boot_lab(
    lab_id: str,
    info: dict,
    *,
    files: list[str | Path],
    shares: dict[str, Path] | None = None,
    mem_mb: int,
    cpus: int,
):
    """Claim host lab `lab_id`, boot its VM and return (vm, guest paths of `files`).

    `info` (id, kind, ...) is completed and written to lab.json. QEMU's PID is in the host
    ledger right after the spawn. On any failure the VM is shut down, the host lab removed
    and the error raised (with the console tail when the boot failed).
    """

    d = create_lab_dir(lab_id)
    ledger = Ledger(d / "ledger.jsonl")
    state_dir = d / "vm"
    ledger.record("vm-lab", id=lab_id, state_dir=str(state_dir))
    info.update(
        id=lab_id,
        state="booting",
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        vm={"state_dir": str(state_dir)},
    )
    write_json_atomic(d / "lab.json", info)

    def record_qemu(rec: dict) -> None:
        ledger.record(
            "process",
            node="vm",
            name="qemu",
            pid=rec["pid"],
            start_time=rec["start_time"],
            argv=rec["argv"][:1],
        )

    vm = None
    try:
        share = d / "share"
        in_guest = [guest_path(f, share) for f in files]
        all_shares: dict[str, Path] = dict(shares or {})
        if share.exists():
            all_shares[GUEST_SHARE] = share
        ledger.record("process-intent", node="vm", name="qemu")
        vm = boot(
            state_dir,
            mem_mb=mem_mb,
            cpus=cpus,
            project_dir=PROJECT,
            shares=all_shares or None,
            on_spawn=record_qemu,
        )
        info.update(
            state="starting",
            substrate=vm_substrate(vm),
            vm={
                "state_dir": str(state_dir),
                **{
                    k: vm.record.get(k)
                    for k in (
                        "pid",
                        "start_time",
                        "accel",
                        "kernel",
                        "mem_mb",
                        "cpus",
                        "boot_seconds",
                    )
                },
            },
        )
        write_json_atomic(d / "lab.json", info)
        return vm, in_guest
    except BaseException as e:
        _unwind(lab_id, vm, e)
        raise


def _unwind(lab_id: str, vm, e: BaseException) -> None:
    """Shut the VM down and remove the host lab; what is left goes into the error's text."""

    notes: list[str] = []
    if vm is not None:
        try:
            vm.shutdown(grace=5)
        except TeardownIncomplete as t:
            notes += t.leftovers
        vm.disconnect()
    left = teardown(lab_id)
    if (left or notes) and isinstance(e, LabError):
        e.args = (f"{e.args[0]}\n(unwinding left over: {'; '.join(left + notes)})",)


def up(
    spec,
    topology: str,
    lab_id: str | None,
    guest_args: list[str],
    *,
    vpn: str | None = None,
    impair: str | None = None,
    placement: str | None = None,
    mem_mb: int = 2048,
    cpus: int = 2,
) -> dict:
    """Boot a VM for lab `lab_id` and run `lab up TOPOLOGY --id ID --json GUEST_ARGS` in it.

    Returns the host record (lab.json). Any failure shuts the VM down and removes the host
    lab (QEMU is stopped by PID; the console tail is in the error).
    """

    netops.check_root()
    lab_id = check_id(lab_id or "lab")
    preflight(spec, vpn, impair, placement)
    require_qemu()
    find_kernel()
    info: dict = {"kind": "up", "topology": str(topology)}
    vm, (topo_in_guest,) = _boot_lab(lab_id, info, files=[topology], mem_mb=mem_mb, cpus=cpus)
    try:
        argv = ["up", topo_in_guest, "--id", lab_id, "--json", *guest_args]
        info["guest_argv"] = argv
        write_json_atomic(lab_dir(lab_id) / "lab.json", info)
        cp = vm.run(
            [sys.executable, "-m", "lab.cli.main", *argv],
            check=False,
            timeout=UP_TIMEOUT,
            cwd=str(PROJECT),
            env={"LAB_SUBSTRATE": json.dumps(info["substrate"])},
        )
        if cp.returncode != 0:
            raise _guest_error("lab up", cp)
        status = json.loads(cp.stdout)
        info.update(state="up", status=status)
        write_json_atomic(lab_dir(lab_id) / "lab.json", info)
        info["guest_stderr"] = cp.stderr  # warnings, for the CLI to show
        return info
    except BaseException as e:
        _unwind(lab_id, vm, e)
        raise
    finally:
        vm.disconnect()


def run_plan(
    plan,
    run,
    plan_path: str | Path,
    *,
    overrides: list[str] | None = None,
    argv: list[str] | None = None,
    mem_mb: int = 2048,
    cpus: int = 2,
    on_boot=None,
) -> tuple[int, list[str], list[str]]:
    """Run `plan` into run directory `run` inside a throwaway full-kernel VM.

    The VM is a host lab of its own (id v*****; QEMU by PID in its ledger, so `lab clean`
    removes it after a crash). The guest runs `lab run --resume RUN PLAN`: the run directory
    is shared at the same path, so results land on the host as they are written, and the run
    can be continued later with `lab run --resume RUN` (which boots a VM again). The guest's
    output is streamed live (a terminal when this one is); Ctrl-C reaches the guest's runner,
    which tears its lab down. The VM is then powered off and the host lab removed; the guest
    writes no report (LAB_RUN_REPORT=host): the caller writes it on the host, where the plots
    take seconds, not minutes. Returns (the guest's exit code, what was left over on the
    host, notes).
    """

    netops.check_root()
    require_qemu()
    find_kernel()
    lab_id = new_lab_id("v")
    info: dict = {
        "kind": "run",
        "plan": plan.name,
        "run_dir": str(run.path),
        "topology": plan.topology_file,
    }
    vm, (plan_in_guest,) = _boot_lab(
        lab_id,
        info,
        files=[plan_path],
        shares={str(run.path): run.path},
        mem_mb=mem_mb,
        cpus=cpus,
    )
    notes: list[str] = []
    try:
        info["state"] = "running"
        write_json_atomic(lab_dir(lab_id) / "lab.json", info)
        if on_boot is not None:
            on_boot(lab_id, info)
        guest = ["run", "--resume", str(run.path), plan_in_guest]
        for o in overrides or []:
            guest += ["-o", o]
        env = {
            **_stream_env(),
            "LAB_SUBSTRATE": json.dumps(info["substrate"]),
            "LAB_RUN_ARGV": json.dumps(argv or ["lab", *guest]),
            "LAB_RUN_REPORT": "host",
        }
        rc = attach(
            vm,
            [sys.executable, "-m", "lab.cli.main", *guest],
            env=env,
            cwd=str(PROJECT),
        )
    except BaseException as e:
        _unwind(lab_id, vm, e)
        raise
    # Power off through the VM object that spawned QEMU (it reaps its child), then the ledger.

    left: list[str] = []
    try:
        vm.shutdown(grace=10)
    except TeardownIncomplete as e:
        left += e.leftovers
    finally:
        vm.disconnect()
    return rc, left + teardown(lab_id, notes), notes


def _guest_error(what: str, cp: subprocess.CompletedProcess) -> LabError:
    """The guest CLI's own error, with its exit code's class (config / precondition / ...)."""
    text = (cp.stderr.strip() or cp.stdout.strip())[-3000:]
    msg = f"in the lab VM, `{what}` failed (exit {cp.returncode}):\n{text}"
    if cp.returncode == ConfigError.exit_code:
        return ConfigError(msg)
    if cp.returncode == PreconditionError.exit_code:
        return PreconditionError(msg)
    if cp.returncode == StartupError.exit_code:
        return StartupError(msg)
    return CommandError(["lab", what], cp.returncode, text, where="vm")


def _attach(lab_id: str):
    info = read_info(lab_id)
    vm = VM.attach(Path(info.get("vm", {}).get("state_dir") or lab_dir(lab_id) / "vm"))
    if not vm.alive():
        raise PreconditionError(
            f"the VM of lab {lab_id!r} (pid {vm.pid}) is not running; "
            f"`lab down --id {lab_id}` removes what is left"
        )
    return vm


def read_info(lab_id: str) -> dict:
    try:
        return json.loads((lab_dir(lab_id) / "lab.json").read_text())
    except (OSError, ValueError):
        return {"id": lab_id}


def _guest_cwd() -> str:
    cwd = Path.cwd()
    if any(cwd == Path(d) or Path(d) in cwd.parents for d in GUEST_PRIVATE):
        return str(PROJECT)
    return str(cwd)


def forward(
    lab_id: str, argv: list[str], *, timeout: float | None = None
) -> subprocess.CompletedProcess:
    """Run `lab ARGV` in the VM of lab `lab_id`; its output and exit code, as the guest gave them."""
    vm = _attach(lab_id)
    try:
        return vm.run(
            [sys.executable, "-m", "lab.cli.main", *argv],
            check=False,
            timeout=timeout or FORWARD_TIMEOUT,
            cwd=_guest_cwd(),
        )
    finally:
        vm.disconnect()


def _stream_env() -> dict[str, str]:
    """Environment for a guest `lab` whose output is streamed: unbuffered (so progress shows as
    it happens, also through pipes), this terminal's type and width."""
    env = {"PYTHONUNBUFFERED": "1"}
    if os.environ.get("TERM"):
        env["TERM"] = os.environ["TERM"]
    cols = os.environ.get("COLUMNS") or (
        str(os.get_terminal_size(sys.stdout.fileno()).columns) if sys.stdout.isatty() else ""
    )
    if cols:
        env["COLUMNS"] = cols
    return env


def forward_interactive(lab_id: str, argv: list[str]) -> int:
    """Run `lab ARGV` in the VM of lab `lab_id` attached to this terminal (or to these pipes):
    output is streamed as it comes, stdin is forwarded, a pty is used when stdin and stdout are
    terminals, Ctrl-C reaches the guest command. Returns its exit code."""

    vm = _attach(lab_id)
    try:
        return attach(
            vm, [sys.executable, "-m", "lab.cli.main", *argv], env=_stream_env(), cwd=_guest_cwd()
        )
    finally:
        vm.disconnect()


def status(lab_id: str) -> dict:
    """The guest's `lab status` of the lab, plus the host's record of the VM."""
    info = read_info(lab_id)
    base = {"id": lab_id, "substrate": info.get("substrate"), "vm": info.get("vm")}
    if info.get("kind") == "run":
        # the running `lab run --vm` holds the VM's only agent channel: report the host record
        alive = _qemu_alive(info)
        return {
            **base,
            "topology": info.get("topology", ""),
            "state": (
                f"VM running plan {info.get('plan')!r} into {info.get('run_dir')}"
                if alive
                else f"VM gone; `lab down --id {lab_id}` removes what is left"
            ),
        }
    try:
        cp = forward(lab_id, ["status", "--id", lab_id, "--json"], timeout=120)
    except LabError as e:
        return {**base, "state": f"broken ({e}); `lab down --id {lab_id}` removes it"}
    if cp.returncode != 0:
        return {**base, "state": f"broken (guest status failed: {cp.stderr.strip()[-300:]})"}
    found = json.loads(cp.stdout or "[]")
    inner = found[0] if found else {"state": "not up inside the VM"}
    return {**inner, **base}


def _qemu_alive(info: dict) -> bool:
    vm = info.get("vm") or {}
    return bool(vm.get("pid")) and is_same_process(vm["pid"], vm.get("start_time"))


def down(lab_id: str, notes: list[str]) -> list[str]:
    """Take the guest lab down (its own teardown runs and is reported), power the VM off, then
    remove the host lab by its ledger (QEMU by PID if it is somehow still there). Returns what
    is left over on the host; never leaves QEMU running if it can be stopped at all."""

    left: list[str] = []
    state_dir = Path(read_info(lab_id).get("vm", {}).get("state_dir") or lab_dir(lab_id) / "vm")
    vm = None
    if (state_dir / "vm.json").exists():
        vm = VM.attach(state_dir)
    if vm is not None and vm.alive() and read_info(lab_id).get("kind") != "run":
        # (a run's VM is powered off as it is: its guest holds nothing but tmpfs)
        try:
            cp = vm.run(
                [sys.executable, "-m", "lab.cli.main", "down", "--id", lab_id],
                check=False,
                timeout=180,
                cwd=str(PROJECT),
            )
            if cp.returncode != 0:
                notes.append(
                    f"guest `lab down` failed (exit {cp.returncode}): "
                    f"{(cp.stderr or cp.stdout).strip()[-500:]}; the VM is powered off anyway"
                )
        except LabError as e:
            notes.append(f"guest `lab down` not run ({e}); the VM is powered off anyway")
    if vm is not None:
        try:
            vm.shutdown(grace=10)
        except TeardownIncomplete as e:
            left += e.leftovers
    return left + teardown(lab_id, notes)
