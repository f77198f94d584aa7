"""`lab run --vm`: a whole plan runs inside a throwaway full-kernel VM, its output streamed to
the host, its results written straight into the host's run directory, and nothing of the VM left
afterwards. Ctrl-C reaches the guest's runner (which tears its lab down; the host writes the
report); `lab run --resume` boots a VM again and finishes the run without redoing a case.

The plan uses profiles this host's kernel cannot run (kernel WireGuard, MACsec) and kernel
netem, so it can only pass if the cases really ran in the VM. Skipped, naming what is missing,
without QEMU or the kernel cache (scripts/fetch-kernel.sh).
"""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import textwrap
import time

import pytest

from lab.core.errors import PreconditionError
from lab.results.rundir import RunDir
from lab.core.state import lab_dir
from tests.conftest import LAB, REPO

pytestmark = [pytest.mark.root, pytest.mark.slow]

PLAN = """
name = "vmrun"
profiles = ["wireguard", "macsec-static"]
impairments = ["none", "delay 20ms"]
reps = 1
duration = 2
[topology]
file = "topologies/pi_pair.py"
cpu = "host"
[[tests]]
test = "ping"
count = 5
interval_s = 0.1
[[tests]]
test = "tcp"
"""


def qemu_processes(mentioning: str) -> set[int]:
    """Running QEMU processes whose command line mentions `mentioning` (this test's VM: its state
    directory, or the run directory it shares; other VMs on the machine are not this test's
    business). Zombies are excluded: this host's init may be slow to reap them."""
    out = subprocess.run(["pgrep", "-f", "qemu-system"], capture_output=True, text=True).stdout
    running = set()
    for pid in map(int, out.split()):
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
        except OSError:
            continue
        if state != "Z" and mentioning in cmdline:
            running.add(pid)
    return running


def vm_ids(text: str) -> list[str]:
    """The VM labs' ids the output names ("v" and five hex digits, lab.core.state), once each."""
    return sorted(set(re.findall(r"(?<![\w-])(v[0-9a-f]{5}):", text)))


def results(run: RunDir) -> list[dict]:
    path = run.path / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def check_vm_run(run: RunDir, n_cases: int) -> None:
    rows = results(run)
    assert len(rows) == n_cases, [r.get("case") for r in rows]
    bad = [(r.get("case"), r.get("error")) for r in rows if not r.get("ok")]
    assert not bad, bad
    assert len({r["case"] for r in rows}) == n_cases  # no case ran twice
    m = run.manifest()
    sub = m["substrate"]
    assert sub["kind"] == "vm" and sub["accelerator"] in ("tcg", "kvm")
    assert sub["host_kernel"] == os.uname().release
    for s in m["sessions"]:  # every session ran on the VM's kernel, not this host's
        assert s["substrate"]["kind"] == "vm"
        assert s["kernel"]["release"] == sub["kernel"] != os.uname().release
    assert m["command_line"][:2] == ["lab", "run"] and "--vm" in m["command_line"]
    assert m["profiles"]["wireguard"]["path"] == "kernel"
    assert m["profiles"]["macsec-static"]["path"] == "kernel"
    applied = json.dumps(m["impairment"])
    assert "kernel-netem" in applied, applied
    report = (run.path / "report.md").read_text()
    assert sub["kernel"] in report
    if sub["accelerator"] == "tcg":
        assert "functional evidence only" in report


# its budgets run in sequence: 600 s for the first case, 300 s to stop, 900 s to resume, 4 x 60
@pytest.mark.timeout(2100)
def test_run_plan_in_vm_interrupt_and_resume(vm_ready, tmp_path):
    plan = tmp_path / "vmrun.toml"
    plan.write_text(textwrap.dedent(PLAN))
    run = RunDir(tmp_path / "run")

    # 1. start, then Ctrl-C once the first case is in: the guest runner stops cleanly
    p = subprocess.Popen(
        [*LAB, "run", str(plan), "--vm", "--out", str(run.path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    while not results(run):
        assert p.poll() is None, p.stdout.read()
        assert time.monotonic() < deadline, "no case finished within 600 s"
        time.sleep(0.5)
    # the host knows what the VM does (without taking the agent channel from the run)
    st = subprocess.run([*LAB, "status", "--json"], capture_output=True, text=True, timeout=60)
    mine = [x for x in json.loads(st.stdout) if str(run.path) in str(x.get("state"))]
    assert len(mine) == 1 and mine[0]["substrate"]["kind"] == "vm", st.stdout
    os.killpg(p.pid, signal.SIGINT)
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 130, out
    assert "lab run --resume" in out, out
    assert "VM powered off" in out, out
    (vid,) = vm_ids(out)
    assert not lab_dir(vid).exists()
    assert not qemu_processes(str(lab_dir(vid))), "QEMU left running"
    assert not qemu_processes(str(run.path)), "QEMU left running"
    partial = results(run)
    assert 1 <= len(partial) < 8
    assert (run.path / "report.md").exists()  # written on the way out (by the host, VM off)

    # 2. resume: a VM again (the plan says vm = true), the remaining cases only
    cp = subprocess.run(
        [*LAB, "run", "--resume", str(run.path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
    )
    out = cp.stdout + cp.stderr
    assert cp.returncode == 0, out[-4000:]
    assert "run directory" in out and "VM powered off" in out
    (vid,) = vm_ids(out)
    assert not lab_dir(vid).exists()
    assert not qemu_processes(str(lab_dir(vid))), "QEMU left running"
    assert not qemu_processes(str(run.path)), "QEMU left running"
    # 2 profiles x 2 conditions x 2 tests; the interrupted case (if any) is redone, none twice
    check_vm_run(run, 8)
    assert len(run.manifest()["sessions"]) == 2


def test_vm_run_refuses_bad_input_before_booting(tmp_path):
    cp = subprocess.run(
        [*LAB, "run", "quick", "--vm", "-o", "profiles=nosuch", "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert cp.returncode == 2 and "profiles" in cp.stderr, cp.stderr
    assert not (tmp_path / "r").exists()
    assert not qemu_processes(str(tmp_path))
    # a host run cannot be continued in a VM (or the reverse): the evidence would be mixed
    host_run = tmp_path / "h"
    from lab.campaign.load import load_plan
    from lab.campaign.setup import create_run_dir

    create_run_dir(load_plan("quick", ["reps=1"]), host_run)
    cp = subprocess.run(
        [*LAB, "run", "--resume", str(host_run), "--vm"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert cp.returncode == 2 and "plan differs" in cp.stderr, cp.stderr
    assert not qemu_processes(str(host_run))


def test_host_run_of_a_kernel_profile_says_use_vm_and_creates_nothing(tmp_path):
    from lab.vpn.profiles import load_profile

    prof = load_profile("gre")
    from lab.core.hostnode import this_machine

    if prof.driver.check(prof.params, this_machine()).ok:
        pytest.skip("this kernel has ip_gre: nothing to refuse")
    out = tmp_path / "r"
    cp = subprocess.run(
        [*LAB, "run", "quick", "-o", "profiles=baseline,gre", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert cp.returncode == PreconditionError.exit_code, cp.stderr
    assert "lab run --vm" in cp.stderr and "-o 'profiles=baseline'" in cp.stderr, cp.stderr
    assert not out.exists()
