"""Bad input through the real `lab` executable (issue 31): the fuzz corpus, out of process.

tests/test_fuzz_inputs.py generates the malformed inputs (topologies, VPN profiles and --vpn
overrides, impairment specs, plans and -o overrides, inventories, lab ids, node names, argument
vectors) and sends them through lab.cli.main.main() in-process, behind a tripwire. Here a
stratified sample of 120 of the same cases runs as root through the installed console script
(`.venv/bin/lab`, the `[project.scripts]` entry, with this checkout first on PYTHONPATH), with
nothing patched, two at a time, while a lab of our own (the canary) is up under the same
LAB_STATE_DIR / LAB_RUN_DIR. Each case must give:

- exit 2, a message naming the file or flag and the field (the corpus says which), and no
  traceback or "internal error";
- the machine as it was: network namespaces, root-namespace links, the cgroup tree and the
  mount table (conftest.machine_snapshot's lists, about 20 ms to read, before and after each
  batch), the state and run directories entry by entry (type, size, mtime: the canary's ledger,
  lab.json and namespace handles included), the --out directories and the checkout's runs/,
  and no process of the case left behind.

The machine is shared (other labs come and go while this runs), so a change of the machine-wide
lists counts when it names a lab this batch could have made: an id passed with --id, the
default id of `lab up`, the corpus's "fz", the canary's, or any lab directory that appeared
under our state root. Every lab object carries its id in its name (netns ID-node, cgroup
lab/ID, the farm's host link lab-ID, mounts under our roots or /run/netns/ID-node). The state
and run roots are ours alone and compared whole.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections import Counter
from itertools import zip_longest
from pathlib import Path

import pytest

from .conftest import REPO, TOPOS, lab_traces, machine_snapshot
from .test_fuzz_inputs import Case, generate, verdict

#: the corpus cases sent through the executable (each about 0.4 s of CPU, most of it imports)
SAMPLE = 120
SEED = 31
#: cases run at once (this machine has 2 CPUs): the machine is compared around each batch, a
#: change failing every case of it; a process left is told apart by its own environment
BATCH = 2
#: a refused input is answered within a second or two; more is an input wrongly accepted
CASE_TIMEOUT_S = 60
#: lab ids a refused case could still have built: the corpus's own and `lab up`'s default
CORPUS_IDS = ("fz", "lab")


def lab_executable() -> list[str]:
    """The installed console script (`lab = "lab.cli.main:main"`) of the interpreter running the
    tests, else the module's own entry point."""
    for script in (REPO / ".venv" / "bin" / "lab", Path(sys.executable).parent / "lab"):
        if script.is_file() and os.access(script, os.X_OK):
            return [str(script)]
    return [sys.executable, "-m", "lab.cli.main"]


def interpreter(script: Path) -> str:
    """The interpreter of a console script: its #! line."""
    return script.read_text().splitlines()[0].removeprefix("#!").strip()


def sendable(case: Case) -> bool:
    """A case of the corpus this test can judge: exit 2 wanted (the cases wanting 3 say "no lab
    is up", and the canary is), a message that must name its input, an argv a process can
    receive (no NUL byte)."""
    return (
        case.codes == (2,)
        and bool(case.names)
        and not case.may_accept
        and "\x00" not in "".join(case.argv)
    )


def sample(cases: list[Case], n: int = SAMPLE, seed: int = SEED) -> list[Case]:
    """`n` sendable cases spread over groups (input kind, what is wrong, command): the groups
    taken in turn, alternating between kinds, one case from each per round, seeded, so every
    kind and most groups are in and a failure reproduces."""
    rng = random.Random(seed)
    groups: dict[tuple, list[Case]] = {}
    for c in cases:
        if sendable(c):
            groups.setdefault((c.kind, c.klass, c.argv[0] if c.argv else ""), []).append(c)
    for g in groups.values():
        rng.shuffle(g)
    by_kind: dict[str, list[tuple]] = {}
    for key in sorted(groups):
        by_kind.setdefault(key[0], []).append(key)
    order = [k for ks in zip_longest(*by_kind.values()) for k in ks if k is not None]
    picked: list[Case] = []
    while len(picked) < n and any(groups.values()):
        for key in order:
            if groups[key] and len(picked) < n:
                picked.append(groups[key].pop())
    return picked


# --------------------------------------------------------------------------- what a case changed


def tree(*dirs: Path) -> dict[str, tuple]:
    """Every entry under `dirs`: path -> (type, size, mtime) without following links (a
    namespace handle is an nsfs file; a node's storage image is not read, only stated)."""
    out = {}
    for d in dirs:
        if not os.path.lexists(d):
            continue
        for p in [d, *d.rglob("*")]:
            try:
                st = p.lstat()
            except FileNotFoundError:
                continue
            size = 0 if stat.S_ISDIR(st.st_mode) else st.st_size
            out[str(p)] = (stat.S_IFMT(st.st_mode), size, st.st_mtime_ns)
    return out


def processes_with(token: str) -> set[int]:
    """Processes whose environment holds `token`: the case's lab and anything it started."""
    found = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            if token.encode() in env:
                found.add(int(pid))
    return found


def named_by(key: str, entry: str, ids: set[str], roots: tuple[Path, ...]) -> bool:
    """Whether a netns / link / cgroup / mount of machine_snapshot() belongs to one of `ids`
    (or lies under our own roots)."""
    if key == "netns":
        return any(entry.startswith(f"{i}-") for i in ids)
    if key == "links":  # nodes' links live in their namespaces; a farm puts one in the root's
        return any(entry.split("@")[0] == f"lab-{i}"[:15] for i in ids)
    if key == "cgroups":
        return any(re.search(rf"/lab/{re.escape(i)}(/|$)", entry) for i in ids)
    if key == "mounts":
        return any(entry == str(r) or entry.startswith(f"{r}/") for r in roots) or any(
            re.search(rf"/netns/{re.escape(i)}-", entry) for i in ids
        )
    raise KeyError(key)


def ids_of(case: Case, canary: str, state: Path) -> set[str]:
    passed = {case.argv[i + 1] for i, a in enumerate(case.argv[:-1]) if a == "--id"}
    made = {p.name for p in state.iterdir()} if state.is_dir() else set()
    return {*CORPUS_IDS, canary, *passed, *made} - {""}


def changes(before: dict, after: dict, ids: set[str], roots: tuple[Path, ...]) -> list[str]:
    """What differs, as 'added/removed KEY ENTRY' or 'changed PATH' lines."""
    out = []
    for key in ("netns", "links", "cgroups", "mounts"):
        b, a = set(before[key]), set(after[key])
        out += [f"added {key} {e}" for e in sorted(a - b) if named_by(key, e, ids, roots)]
        out += [f"removed {key} {e}" for e in sorted(b - a) if named_by(key, e, ids, roots)]
    b, a = before["files"], after["files"]
    out += [f"added {p}" for p in sorted(a.keys() - b.keys())]
    out += [f"removed {p}" for p in sorted(b.keys() - a.keys())]
    out += [f"changed {p} {b[p]} -> {a[p]}" for p in sorted(a.keys() & b.keys()) if a[p] != b[p]]
    return out


# --------------------------------------------------------------------------- the test


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """This test's own state and run roots (the canary's and the cases'), the latter under /run
    like the default where we may write there; removed after, when empty."""
    state = tmp_path / "state"
    run = Path(f"/run/lab-fuzzcli-{secrets.token_hex(3)}")
    if not os.access("/run", os.W_OK):
        run = tmp_path / "run"
    monkeypatch.setenv("LAB_STATE_DIR", str(state))
    monkeypatch.setenv("LAB_RUN_DIR", str(run))
    # this checkout's package before the installed one (an editable install may point at another
    # worktree): the executable is the installed one, the code is the one under test
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x)
    )
    # bytecode compiled once for all cases, kept out of the checkout: without a cache each
    # process compiles lab/ again (0.65 s of CPU a case instead of 0.4 where
    # PYTHONDONTWRITEBYTECODE is set)
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "pycache"))
    yield state, run
    # a case wrongly accepted may have left a lab: the lab's own teardown removes it (these
    # roots are ours alone), and its ledger stays for a human to see when that fails
    cleaned = lab("clean", timeout=120)
    assert cleaned.returncode == 0, f"{state}, {run}: {cleaned.stdout}{cleaned.stderr}"
    shutil.rmtree(state, ignore_errors=True)
    if run.is_dir():
        for d in sorted((p for p in run.rglob("*") if p.is_dir()), reverse=True):
            d.rmdir()  # only empty directories: a mount left fails the test here
        run.rmdir()


def lab(*argv, token: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*lab_executable(), *map(str, argv)],
        capture_output=True, text=True, env=case_env(token), cwd=REPO, timeout=timeout,
    )  # fmt: skip


def case_env(token: str | None) -> dict[str, str]:
    """The environment of a `lab` process; `token` marks it and every process it starts."""
    return {**os.environ, **({"LAB_FUZZ_CLI": token} if token else {})}


def run_batch(batch: list[Case]) -> list[tuple[Case, str, int, str]]:
    """The cases of `batch` at once, each its own `lab` process: (case, token, exit, stderr).
    One that is not done within CASE_TIMEOUT_S (an input wrongly accepted: a campaign runs) is
    interrupted as Ctrl-C would (its process group: lab tears down what it built), then killed."""
    started = []
    for case in batch:
        token = f"lab-fuzz-cli-{secrets.token_hex(4)}"
        p = subprocess.Popen(
            [*lab_executable(), *case.argv],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=case_env(token), cwd=REPO, start_new_session=True,
        )  # fmt: skip
        started.append((case, token, p))
    done = []
    for case, token, p in started:
        try:
            _, err = p.communicate(timeout=CASE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for sig, wait in ((signal.SIGINT, 60), (signal.SIGKILL, None)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, sig)
                try:
                    _, err = p.communicate(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            err += f"\n(still running after {CASE_TIMEOUT_S} s: interrupted)"
        done.append((case, token, p.returncode, err))
    return done


@pytest.mark.root
def test_bad_input_through_the_lab_executable_changes_nothing(tmp_path, roots):
    state, run = roots
    exe = lab_executable()
    # the executable runs this checkout's code
    python = [sys.executable] if len(exe) > 1 else [interpreter(Path(exe[0]))]
    where = subprocess.run(
        [*python, "-c", "import lab; print(lab.__file__)"],
        capture_output=True, text=True, cwd=tmp_path, check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(where).resolve() == (REPO / "lab" / "__init__.py").resolve(), where

    cases = sample(generate(tmp_path / "corpus"))
    assert len(cases) >= 100
    kinds = Counter(c.kind for c in cases)
    assert set(kinds) >= {"topology", "vpn", "impair", "plan", "inventory", "cli", "id", "node"}
    assert sum(c.argv[:1] == ["up"] for c in cases) >= 30, kinds

    # the canary: a lab of ours (namespaces, cgroups, mounts, state) every case must leave alone
    canary = "cny" + secrets.token_hex(3)
    r = lab("up", TOPOS / "pi_pair.py", "--id", canary)
    assert r.returncode == 0, r.stdout + r.stderr
    watched = (state, run, tmp_path / "corpus" / "out", REPO / "runs")
    failures = []
    t0 = time.monotonic()
    try:
        for i in range(0, len(cases), BATCH):
            batch = cases[i : i + BATCH]
            before = {**machine_snapshot(), "files": tree(*watched)}
            results = run_batch(batch)
            after = {**machine_snapshot(), "files": tree(*watched)}
            ids = set().union(*(ids_of(c, canary, state) for c in batch))
            changed = changes(before, after, ids, (state, run))
            for case, token, rc, stderr in results:
                left = [f"process {p} left running" for p in processes_with(token)]
                bad = verdict(case, rc, stderr, {*changed, *left})
                if bad:
                    others = [str(c) for c in batch if c is not case]
                    failures.append(f"{case}\n    -> {bad}" + "".join(
                        f"\n    (run at the same time as {o})" for o in others if changed
                    ))  # fmt: skip
    finally:
        took = time.monotonic() - t0
        d = lab("down", "--id", canary)
    assert d.returncode == 0, d.stdout + d.stderr
    assert lab_traces(canary) == []
    report = "\n".join(failures)
    assert not failures, f"{len(failures)} of {len(cases)} cases ({took:.0f} s):\n{report}"
