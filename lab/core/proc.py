"""The one place the lab runs external commands.

Every command is an argument list (never a shell string). Failures raise CommandError carrying
argv, where it ran, the exit code and the tail of stderr.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from lab.core.errors import CommandError, PreconditionError

_T = TypeVar("_T")


def which(tool: str) -> str | None:
    """Absolute path of `tool` on PATH (plus the sbin directories root normally has)."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/local/sbin"
    return shutil.which(tool, path=path)


def require(tool: str, why: str = "") -> str:
    found = which(tool)
    if not found:
        hint = f" ({why})" if why else ""
        raise PreconditionError(f"required tool '{tool}' not found on PATH{hint}; run ./setup.sh")
    return found


def _launch(
    start: Callable[..., _T],
    argv: list[str],
    env: Mapping[str, str] | None,
    preexec: Callable[[], None] | None,
    cwd: str | None,
    **kw: Any,
) -> _T:
    """start(argv, ...) (subprocess.run or subprocess.Popen) with what run and spawn share: env
    as a dict, preexec, cwd; a program that is not there is a PreconditionError naming it."""
    try:
        env_ = dict(env) if env is not None else None
        return start(argv, env=env_, preexec_fn=preexec, cwd=cwd, **kw)
    except FileNotFoundError as e:
        raise PreconditionError(f"required tool '{argv[0]}' not found; run ./setup.sh") from e


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float | None = 60,
    input: str | bytes | None = None,
    env: Mapping[str, str] | None = None,
    where: str | None = None,
    preexec: Callable[[], None] | None = None,
    text: bool = True,
    cwd: str | None = None,
) -> subprocess.CompletedProcess:
    """Run argv to completion, capturing output. Raises CommandError on non-zero exit if check."""
    argv = [str(a) for a in argv]
    try:
        cp = _launch(
            subprocess.run,
            argv,
            env,
            preexec,
            cwd,
            input=input,
            capture_output=True,
            timeout=timeout,
            text=text,
        )
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise CommandError(argv, -1, f"timed out after {timeout}s\n{err}", where=where) from e
    if check and cp.returncode != 0:
        raise CommandError(argv, cp.returncode, cp.stderr, where=where, stdout=cp.stdout)
    return cp


def spawn(
    argv: Sequence[str],
    *,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
    stdin=subprocess.DEVNULL,
    env: Mapping[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
    new_session: bool = True,
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen:
    """Start argv in the background and return the Popen handle."""
    argv = [str(a) for a in argv]
    return _launch(
        subprocess.Popen,
        argv,
        env,
        preexec,
        cwd,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=new_session,
        pass_fds=tuple(pass_fds),
    )


def proc_start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat), None if gone.

    Recorded together with the PID so that teardown never signals a recycled PID.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return parse_start_time(data)


def parse_start_time(data: bytes | str) -> int | None:
    """Start time (field 22) from the text of a /proc/PID/stat file, None for a zombie or for
    text that is not one (an empty read: the process is gone). Pure: Node.adopt() feeds it what
    a node printed."""
    if isinstance(data, str):
        data = data.encode()
    if b")" not in data:
        return None
    # comm may contain spaces and parentheses: split after the last ')'.
    rest = data[data.rindex(b")") + 2 :].split()
    if len(rest) < 20 or rest[0] == b"Z":
        return None  # a zombie is already dead; only its parent can reap it
    return int(rest[19])


def is_same_process(pid: int, start_time: int | None) -> bool:
    st = proc_start_time(pid)
    return st is not None and (start_time is None or st == start_time)


def stop_pid(pid: int, start_time: int | None, *, grace: float = 3.0) -> bool:
    """SIGTERM, wait up to `grace`, then SIGKILL, and reap if it is our child.

    Signals only if (pid, start_time) still names the process that was recorded.
    Returns True when the process is gone afterwards.
    """
    if not is_same_process(pid, start_time):
        _reap(pid)
        return True
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(pid)
            if not is_same_process(pid, start_time):
                return True
            time.sleep(0.01)
    _reap(pid)
    return not is_same_process(pid, start_time)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
