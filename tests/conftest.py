"""Shared fixtures. Privileged tests are marked `root` and skipped (saying so) without root."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOPOS = REPO / "topologies"
LAB = [sys.executable, "-m", "lab.cli.main"]


DEFAULT_ROOTS = {"LAB_STATE_DIR": "/var/lib/lab", "LAB_RUN_DIR": "/run/lab"}  # lab.core.state's


@pytest.fixture(scope="session", autouse=True)
def suite_state_roots(tmp_path_factory):
    """The whole suite's own LAB_STATE_DIR and LAB_RUN_DIR, fresh for this session, so no test
    (`lab clean` above all, which removes every lab it finds) ever sees the labs a user has up
    under the default roots. Set even when the caller's environment names roots (they may be the
    user's); a test wanting other roots sets its own (monkeypatch, board_farm), restored after.
    The run root lies under /run like the default (hidden inside nodes) when we may write there."""
    saved = {k: os.environ.get(k) for k in DEFAULT_ROOTS}
    state = tmp_path_factory.mktemp("labstate")
    run = Path(f"/run/lab-suite-{os.getpid()}") if os.access("/run", os.W_OK) else None
    if run is None:
        run = tmp_path_factory.mktemp("labrun")
    os.environ["LAB_STATE_DIR"] = str(state)
    os.environ["LAB_RUN_DIR"] = str(run)
    yield {"LAB_STATE_DIR": state, "LAB_RUN_DIR": run}
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    # empty directories only: anything a leaked lab left (a mount) stays for `lab clean` to find
    if run.is_dir():
        for d in sorted((p for p in run.rglob("*") if p.is_dir()), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            run.rmdir()


#: fixtures that boot the full-kernel VM (QEMU TCG): a test using one runs in the "vm" group
VM_FIXTURES = {"vm", "vm_ready", "guest", "kern"}


@pytest.hookimpl(tryfirst=True)  # before xdist turns the groups into node ids
def pytest_collection_modifyitems(config, items):
    """Two groups for pytest-xdist (`-n 2 --dist loadgroup`, the README's test command): the
    tests that boot the VM, and everything else. QEMU's single-threaded TCG keeps one host CPU
    busy, so the VM tests run beside the host's tests on the other; each group runs in order on
    one worker, so no two host tests ever run at once (their before/after machine snapshots see
    only their own labs; the VM changes nothing on the host: no netns, link, cgroup or mount)."""
    for item in items:
        vm = item.get_closest_marker("vm") or VM_FIXTURES & set(getattr(item, "fixturenames", ()))
        item.add_marker(pytest.mark.xdist_group("vm" if vm else "host"))
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root: creates network namespaces, cgroups and mounts")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def lab_id():
    """A fresh lab id for one test; the lab is always torn down afterwards."""
    lid = "t" + secrets.token_hex(3)
    yield lid
    from lab.core.teardown import teardown

    teardown(lid)


def run_lab(*args, env=None, check=False, timeout=120):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(
        [*LAB, *map(str, args)],
        capture_output=True,
        text=True,
        env=e,
        timeout=timeout,
        cwd=REPO,
        check=check,
    )


@contextmanager
def board_farm(
    tmp_path_factory,
    tools: tuple[str, ...] = (),
    topology: str = "pi_pair_middlebox.py",
    extra: tuple[str, ...] = (),
):
    """An emulated board farm of `topology` (`extra`: more `lab boards emulate` arguments),
    yielded as (inventory path, `lab boards emulate --json` record), with a state root of the
    calling module's own (`lab clean` there sees only its labs; the boards get their private
    /var/lib/lab over it); the farm is removed and the environment restored after. Skipped when
    sshd, ssh, ssh-keygen or `tools` lack."""
    import json
    import shutil

    for tool in ("sshd", "ssh", "ssh-keygen", *tools):
        if not shutil.which(tool) and not shutil.which(tool, path="/usr/sbin"):
            pytest.skip(f"{tool} missing (./setup.sh installs it)")
    saved = {k: os.environ.get(k) for k in ("LAB_STATE_DIR", "LAB_RUN_DIR")}
    os.environ["LAB_STATE_DIR"] = str(tmp_path_factory.mktemp("state"))
    os.environ["LAB_RUN_DIR"] = str(tmp_path_factory.mktemp("run"))
    try:
        inv = tmp_path_factory.mktemp("farm") / "farm.toml"
        r = run_lab("boards", "emulate", TOPOS / topology, "--out", inv, *extra, "--json")
        assert r.returncode == 0, r.stderr
        rec = json.loads(r.stdout)
        try:
            yield inv, rec
        finally:
            d = run_lab("boards", "emulate", "--down", "--id", rec["id"])
            assert d.returncode == 0, d.stdout + d.stderr
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def lab_traces(lab_id: str) -> list[str]:
    """Everything of lab `lab_id` still on the machine (empty when fully removed)."""
    from lab.core import cgroups
    from lab.core.state import lab_dir, run_root

    found = []
    for ns in Path("/var/run/netns").glob(f"{lab_id}-*") if Path("/var/run/netns").exists() else []:
        found.append(f"netns {ns.name}")
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4]
            if f"/lab/{lab_id}" in mp:
                found.append(f"mount {mp}")
    layout = cgroups.probe()
    for d in layout.dirs(f"lab/{lab_id}"):
        if d.exists():
            found.append(f"cgroup {d}")
    if lab_dir(lab_id).exists():
        found.append(f"state {lab_dir(lab_id)}")
    for bf in Path("/sys/block").glob("loop*/loop/backing_file"):
        # a node's storage image (lab.core.blockdev) still attached, even if deleted
        with contextlib.suppress(OSError):
            if bf.read_text().strip().startswith(f"{lab_dir(lab_id)}/"):
                found.append(f"loop device {bf.parent.parent.name}")
    if (run_root() / lab_id).exists():
        found.append(f"run {run_root() / lab_id}")
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cg = Path(f"/proc/{pid}/cgroup").read_text()
            except OSError:
                continue
            if f"/lab/{lab_id}/" in cg:
                found.append(f"process {pid}")
    return found


def kernel_quota_cores(layout, rel: str) -> float | None:
    """The CFS quota of cgroup `rel` as the kernel holds it, in cores (None = unlimited)."""
    if layout.version == 2:
        quota, period = (layout.root / rel / "cpu.max").read_text().split()
    else:
        d = layout.root / "cpu" / rel
        quota = (d / "cpu.cfs_quota_us").read_text().strip()
        period = (d / "cpu.cfs_period_us").read_text().strip()
    return None if quota in ("max", "-1") else int(quota) / int(period)


def machine_snapshot() -> dict:
    """What `lab down` must leave as it found: netns list, links, cgroup tree, mounts. Read so
    that a group another lab removes meanwhile is skipped, not an error (os.walk)."""
    from lab.core import cgroups

    cg = sorted(top for d in cgroups.probe().dirs("") for top, _, _ in os.walk(d) if top != str(d))
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {
        "netns": sorted(os.listdir("/var/run/netns")) if os.path.isdir("/var/run/netns") else [],
        "links": sorted(line.split(":")[1].strip() for line in links.splitlines()),
        "cgroups": cg,
        "mounts": sorted(line.split()[4] for line in open("/proc/self/mountinfo")),
    }


def vm_kernel_or_skip():
    """The VM kernel (lab.substrate.vm.Kernel), or skip naming what is missing: QEMU, or the kernel cache
    that scripts/fetch-kernel.sh fills."""
    from lab.core.errors import PreconditionError
    from lab.core.proc import which
    from lab.substrate.vm import find_kernel
    from lab.substrate.vm.qemu import QEMU

    if not which(QEMU):
        pytest.skip(f"{QEMU} not installed (apt-get install qemu-system-x86)")
    try:
        return find_kernel()
    except PreconditionError as e:
        pytest.skip(f"VM kernel cache missing: {e}")


@pytest.fixture(scope="module")
def vm_ready():
    """Skip the test unless a lab VM can boot here (QEMU and the kernel cache present)."""
    return vm_kernel_or_skip()


@contextmanager
def router_capture(lab, pcap: Path):
    """tcpdump on the router's client-side interface into `pcap` while the block runs."""
    tcpdump = lab.node("router").popen(
        ["tcpdump", "-i", "router-eth0", "-n", "-U", "--immediate-mode", "-Z", "root",
         "-w", str(pcap)],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert b"listening on" in tcpdump.stderr.readline()
        yield
        time.sleep(0.3)
    finally:
        tcpdump.terminate()
        tcpdump.wait(timeout=5)


def captured(lab, pcap: Path, flt: str) -> int:
    """How many packets of a router_capture `pcap` match the tcpdump filter `flt` (read on the
    router, which wrote it; a filter tcpdump refuses is an error, not 0)."""
    return len(lab.node("router").run(["tcpdump", "-r", str(pcap), "-n", flt]).stdout.splitlines())
