"""Per-lab state: where it lives, the ownership ledger, and atomic JSON files.

The ledger is an append-only JSON-lines file. A line is written (and fsynced) *before* the
object it names is created, so a lab killed at any point can be removed exactly: teardown walks
the ledger backwards and removes whatever of it exists. Objects recorded but never created are
simply not found.
"""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
from pathlib import Path
from typing import Any

from lab.core.errors import ConfigError, PreconditionError
import secrets

ID_RE = re.compile(r"^[a-z][a-z0-9]{0,11}$")


def state_root() -> Path:
    """Persistent per-lab state (ledger, configs, secrets, logs). Visible inside nodes."""
    return Path(os.environ.get("LAB_STATE_DIR", "/var/lib/lab"))


def run_root() -> Path:
    """Volatile per-lab runtime objects (mount-namespace handles). Hidden inside nodes."""
    return Path(os.environ.get("LAB_RUN_DIR", "/run/lab"))


def check_id(lab_id: str) -> str:
    if not ID_RE.match(lab_id or ""):
        raise ConfigError(
            f"lab id {lab_id!r} must be 1..12 lowercase letters/digits starting with a letter",
            source="--id",
        )
    return lab_id


def lab_dir(lab_id: str) -> Path:
    return state_root() / lab_id


def new_lab_id(prefix: str) -> str:
    """`prefix` + 5 hex digits, not taken by any lab on this machine (run labs: "r", the VM of
    a `lab run --vm`: "v"). create_lab_dir still claims it atomically."""

    while True:
        lab_id = prefix + secrets.token_hex(3)[:5]
        if not lab_dir(lab_id).exists():
            return check_id(lab_id)


def create_lab_dir(lab_id: str) -> Path:
    """Claim lab `lab_id`: its state directory, created atomically (mode 0700).

    The first thing `lab up` creates; an existing directory means the id is taken (a lab is up
    or was not cleaned), and nothing else is touched.
    """
    d = lab_dir(lab_id)
    d.parent.mkdir(parents=True, exist_ok=True)
    try:
        d.mkdir(mode=0o700)
    except FileExistsError:
        raise PreconditionError(
            f"lab {lab_id!r} already exists ({d}); `lab down --id {lab_id}` or `lab clean` first, "
            "or choose another --id"
        ) from None
    return d


def list_lab_ids() -> list[str]:
    root = state_root()
    if not root.is_dir():
        return []
    return sorted(
        p.name for p in root.iterdir() if (p / "ledger.jsonl").exists() and ID_RE.match(p.name)
    )


def write_json_atomic(path: Path, data: Any, *, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=False, default=str)
            f.write("\n")
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str, *, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class _FaultInjector:
    """Test hook: LAB_KILL_AT_RECORD=N SIGKILLs this process right after its N-th ledger line.

    Lets the crash-safety tests stop `lab up` deterministically at every step, VPN daemons and
    impairment engines included. Counts every ledger write of the process.
    """

    def __init__(self) -> None:
        v = os.environ.get("LAB_KILL_AT_RECORD")
        self.at = int(v) if v else None
        self.count = 0

    def __call__(self) -> None:
        if self.at is None:
            return
        self.count += 1
        if self.count == self.at:
            os.kill(os.getpid(), signal.SIGKILL)


_fault = _FaultInjector()


class Ledger:
    """Append-only record of every object a lab owns."""

    def __init__(self, path: Path):
        self.path = path

    def record(self, kind: str, **data: Any) -> dict:
        entry = {"kind": kind, **data}
        line = json.dumps(entry, default=str) + "\n"
        # O_APPEND: concurrent writers (several `lab` commands on one lab) never interleave lines
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        _fault()
        return entry

    def entries(self) -> list[dict]:
        return read_jsonl(self.path)


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSON-lines file written line by line; a line cut short by a crash (its
    object never created, its case never finished) is skipped. Missing file: no records."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
