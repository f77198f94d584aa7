"""The Slurm recipe for real (root): docs/examples/scale/slurm/submit.sh on a one-node Slurm
cluster this test starts (munged, slurmctld, slurmd in a temporary directory, each ended by its
PID afterwards). A tiny plan (baseline, ping x5, 3 repetitions, cpu=host) runs as 3 shards of a
job array, then the afterok merge job; the merged run holds every case once, each shard ran its
own repetition in a lab of its own, and the files have the schema of a one-machine `lab run` of
the same plan. `lab merge` refuses a real shard of another plan (impaired: its engine seeded from the case id)
and one made by other code (a second checkout with one edited module).
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest.mock import ANY

import pytest

from lab.campaign.load import load_plan
from lab.results.rundir import RunDir
from lab.campaign.shard import case_id

from .conftest import REPO, lab_traces

pytestmark = pytest.mark.root

RECIPE = REPO / "docs/examples/scale/slurm"
DAEMONS = {"munged": "munge", "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm"}
CLIENTS = ("sbatch", "scontrol", "sinfo", "scancel")

PLAN = """
name = "slurm-tiny"
profiles = ["baseline"]
impairments = ["none"]
reps = 3
[topology]
file = "topologies/pi_pair.py"
cpu = "host"
[[tests]]
test = "ping"
count = 5
interval_s = 0.05
"""

SLURM_CONF = """
ClusterName=labtest
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.sock
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _tool(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _poll(what: str, check, timeout: float, step: float = 0.3):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = check()
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def cluster():
    """A one-node Slurm cluster: env with SLURM_CONF (and the lab's own state roots)."""
    for tool, pkg in [*DAEMONS.items(), *((c, "slurm-wlm") for c in CLIENTS)]:
        if _tool(tool) is None:
            pytest.skip(f"{tool} missing (Debian package {pkg}; ./setup.sh installs it)")
    d = Path(tempfile.mkdtemp(prefix="slurm"))  # short: the munge socket path is <= 108 bytes
    os.chmod(d, 0o700)
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    (d / "munge.key").write_bytes(os.urandom(1024))
    os.chmod(d / "munge.key", 0o400)
    host = socket.gethostname().split(".")[0]
    conf = d / "slurm.conf"
    conf.write_text(
        SLURM_CONF.format(
            host=host, d=d, cpus=os.cpu_count(), ctld_port=_free_port(), d_port=_free_port()
        )
    )
    saved = {k: os.environ.get(k) for k in ("LAB_STATE_DIR", "LAB_RUN_DIR")}
    os.environ["LAB_STATE_DIR"] = str(d / "labstate")
    os.environ["LAB_RUN_DIR"] = str(d / "labrun")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs: list[subprocess.Popen] = []
    log = open(d / "daemons.log", "w")  # noqa: SIM115 -- open for the daemons' lifetime
    try:
        procs.append(
            subprocess.Popen(
                [_tool("munged"), "-F", "-f", f"--key-file={d}/munge.key",
                 f"--socket={d}/munge.sock", f"--pid-file={d}/munged.pid",
                 f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"],
                stdout=log, stderr=log,
            )
        )  # fmt: skip
        _poll("munged's socket", lambda: (d / "munge.sock").exists(), 10)
        for argv in ([_tool("slurmctld"), "-D", "-i"], [_tool("slurmd"), "-D"]):
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=log))

        def idle():
            r = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
            return r.returncode == 0 and r.stdout.strip() == "idle"

        _poll("the node to be idle (sinfo)", idle, 30)
        yield {"env": env, "dir": d}
    finally:
        jobs = subprocess.run(
            ["squeue", "-h", "-o", "%A"], env=env, capture_output=True, text=True
        ).stdout.split()
        if jobs:
            subprocess.run(["scancel", *jobs], env=env, capture_output=True)
            _poll("cancelled jobs to end", lambda: not subprocess.run(
                ["squeue", "-h"], env=env, capture_output=True, text=True).stdout.strip(), 30)  # fmt: skip
        for p in reversed(procs):  # by PID, the last started first
            p.terminate()
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        log.close()
        labs = sorted(p.name for p in (d / "labstate").glob("*") if p.is_dir())
        left = [t for lid in labs for t in lab_traces(lid) if not t.startswith("state ")]
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(d, ignore_errors=True)
        assert not left, f"left behind by the shards' labs: {left}"


def _checkout(dest: Path) -> Path:
    """A copy of this checkout's lab/ (and topologies/, which plans name relative to it), the
    rest linked: the code the test runs stays the same while others edit the repository."""
    dest.mkdir()
    copied = ("lab", "topologies")
    for p in REPO.iterdir():
        if p.name not in (*copied, ".git", "runs"):
            (dest / p.name).symlink_to(p)
    for name in copied:
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _lab(*args, env, cwd, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "lab.cli.main", *map(str, args)],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def _job_state(job: str, env) -> str:
    r = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True)
    states = re.findall(r"JobState=(\w+)", r.stdout)
    if states and all(s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") for s in states):
        return ",".join(sorted(set(states)))
    return ""


def _csv_header(path: Path) -> list[str]:
    with open(path) as f:
        return next(csv.reader(f))


def _headings(path: Path) -> list[str]:
    return [ln for ln in path.read_text().splitlines() if ln.startswith("#")]


def test_slurm_array_then_merge(cluster, tmp_path):
    env = cluster["env"]
    plan_file = tmp_path / "tiny.toml"
    plan_file.write_text(PLAN)
    shards, merged = tmp_path / "shards", tmp_path / "merged"
    env = {**env, "LAB": f"{sys.executable} -m lab.cli.main"}
    snap = _checkout(tmp_path / "checkout")  # every run but the edited one: this code
    r = subprocess.run(
        [RECIPE / "submit.sh", plan_file, "3", shards, merged,
         f"--chdir={snap}", f"--output={tmp_path}/%x-%j.out"],
        env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    array, merge_job = re.fullmatch(
        r"shards: job (\d+) \(array 0-2\); merge: job (\d+) -> .*\n", r.stdout
    ).groups()
    # meanwhile, the same plan on one machine, for the schema
    single = tmp_path / "single"
    one = _lab("run", plan_file, "--out", single, env=env, cwd=snap)
    assert one.returncode == 0, one.stdout + one.stderr
    state = _poll("the merge job to end", lambda: _job_state(merge_job, env), 90, 1)
    logs = "".join(p.read_text() for p in sorted(tmp_path.glob("*.out")))
    assert state == "COMPLETED", f"merge job {state}; array {_job_state(array, env)}\n{logs}"
    assert _job_state(array, env) == "COMPLETED"

    plan = load_plan(plan_file)
    want = [c.key for c in plan.cases()]
    assert want == [f"baseline|none|ping|{i}" for i in range(3)]
    run = RunDir(merged)
    results = run.load_results()
    assert [r["case"] for r in results] == want and all(r["ok"] for r in results)
    # shard i of 3 ran repetition i (one cell of 3 repetitions: blocks of one), each in its
    # own lab, and recorded its shard, the code version and this machine's calibration
    lab_ids = set()
    for i in range(3):
        sd = RunDir(shards / f"shard-{i}")
        assert [r["case"] for r in sd.load_results()] == [want[i]]
        m = sd.manifest()
        assert m["shard"] == {"index": i, "count": 3}
        assert m["plan_digest"] == plan.digest()
        assert m["calibration"]["profiles"]["host"]["calibrated"] is True
        lab_ids |= {e["lab_id"] for e in sd.load_timeline() if e.get("event") == "up"}
    assert len(lab_ids) == 3
    mm = run.manifest()
    assert [x["shard"]["index"] for x in mm["merged_from"]] == [0, 1, 2]
    # the same schema as the one-machine run
    ref = RunDir(single)
    for name in ("results.csv", "summary.csv"):
        assert _csv_header(merged / name) == _csv_header(single / name)
    assert [sorted(r) for r in results] == [sorted(r) for r in ref.load_results()]
    assert set(ref.manifest()) <= set(mm) and set(mm) - set(ref.manifest()) == {"merged_from"}
    assert _headings(merged / "report.md")[1:] == _headings(single / "report.md")[1:]
    assert sorted(p.name for p in (merged / "plots").iterdir()) == sorted(
        p.name for p in (single / "plots").iterdir()
    )

    # a real shard of another plan (impaired: another digest) is refused, naming it
    other = tmp_path / "other-plan"
    r = _lab(
        "run", plan_file, "-o", "impairments=loss 5%", "--shard", "1/3", "--out", other,
        env=env, cwd=snap,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    # its impairment's draws were seeded from the id of the case it served (repetition 1 of
    # the one cell), as the engine itself reports its spec back
    o = RunDir(other)
    (res,) = o.load_results()
    assert res["case"] == "baseline|loss-5|ping|1"
    shown = o.manifest()["impairment"]["loss-5"]["baseline"]
    seed = int(case_id(o.manifest()["plan_digest"], res["case"])[:8], 16)
    if shown["backend"] == "kernel-netem":  # iproute2 < 6.6: netem takes no seed
        assert shown["seed"] == {"derived": seed, "applied": False, "why": ANY}
    else:
        specs = [e[d]["spec"] for e in shown["engines"].values() for d in ("a2b", "b2a")]
        assert specs and all(sp["seed"] == seed for sp in specs), specs
    dirs = [shards / "shard-0", other, shards / "shard-2"]
    r = _lab("merge", *dirs, "--out", tmp_path / "m1", env=env, cwd=snap)
    assert r.returncode == 2 and f"{other}: plan digest: plan digest" in r.stderr, r.stderr
    assert not (tmp_path / "m1").exists()

    # a real shard made by other code: a second checkout whose lab/ has one edited module
    code = _checkout(tmp_path / "checkout-edited")
    with open(code / "lab" / "shard.py", "a") as f:
        f.write("\n# an edit: another code version\n")
    newer = tmp_path / "other-code"
    r = _lab("run", plan_file, "--shard", "1/3", "--out", newer, env=env, cwd=code)
    assert r.returncode == 0, r.stdout + r.stderr
    assert RunDir(newer).manifest()["plan_digest"] == plan.digest()
    dirs = [shards / "shard-0", newer, shards / "shard-2"]
    r = _lab("merge", *dirs, "--out", tmp_path / "m2", env=env, cwd=snap)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{newer}: code_version.source_sha256: code version source_sha256" in r.stderr
    assert not (tmp_path / "m2").exists()
