"""OpenSSH's own cipher throughput per CPU second, for `lab calibrate` (scp's crypto).

scp on a board is bound by the ssh process that encrypts and MACs every byte on one core, with
OpenSSH's own code around OpenSSL's (chacha20-poly1305@openssh.com: OpenSSL's ChaCha20 and
OpenSSH's portable Poly1305; the AES modes: OpenSSL EVP and, for -ctr, OpenSSH's UMAC). So the
figure that matters is the ssh client's throughput per CPU second with the node's masks, not
`openssl speed`'s. It is measured with a real sshd:

- a throwaway network namespace `calib-ssh-<pid>` (loopback only) holds an sshd started from
  lab.measure.scp.sshd_config with keys made for this run in a fresh 0700 directory; the sshd is
  stopped by PID and the namespace and directory are removed in `finally`;
- `ssh -c CIPHER root@127.0.0.1 'cat > /dev/null'` reads N MiB of random bytes on its stdin; the
  client is started through `nsenter --net=...`, which execs it under the same PID, so the CPU
  time our children gained during the run is the ssh client's alone (sshd is reaped only at the
  end); a session with no payload gives the handshake's CPU, which is subtracted.
The server side (decryption in sshd) is not measured: on a board it runs on another core.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from lab.core import netops, proc
from lab.core.errors import CommandError, LabError, PreconditionError
from lab.measure.scp import sshd_config

PORT = 22
ADDR = "127.0.0.1"
MIB = 1024 * 1024


def _child_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def missing_tools() -> list[str]:
    return [t for t in ("ssh", "sshd", "ssh-keygen", "nsenter", "ss") if not proc.which(t)]


def client_argv(ns: str, state: Path, cipher: str) -> list[str]:
    """The ssh client in the namespace: no user config, pinned host key, one cipher."""
    return [
        proc.require("nsenter"),
        f"--net={netops.NETNS_DIR / ns}",
        proc.require("ssh"),
        "-F",
        "/dev/null",
        "-i",
        str(state / "id_ed25519"),
        "-p",
        str(PORT),
        "-c",
        cipher,
        "-o",
        "BatchMode=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={state / 'known_hosts'}",
        "-o",
        "Compression=no",
        "-o",
        "LogLevel=ERROR",
        f"root@{ADDR}",
        "cat > /dev/null",
    ]


def per_cpu_second(nbytes: int, cpu_s: float, handshake_cpu_s: float) -> float:
    """MB (10^6 bytes) per CPU second of the transfer itself: the handshake's CPU subtracted."""
    work = cpu_s - handshake_cpu_s
    return nbytes / work / 1e6 if work > 0 else 0.0


def _session(argv: list[str], payload: bytes, env: dict[str, str]) -> tuple[float, float]:
    """(elapsed s, CPU s of the ssh client) of one session sending `payload`."""
    c0, t0 = _child_cpu(), time.monotonic()
    proc.run(argv, input=payload, env=env, text=False, timeout=120, where="calibrate ssh")
    return time.monotonic() - t0, _child_cpu() - c0


def _wait_listening(ns: str, daemon, timeout: float = 10.0) -> None:
    argv = [proc.require("nsenter"), f"--net={netops.NETNS_DIR / ns}", "ss", "-Hltn"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            err = daemon.stderr.read().decode(errors="replace") if daemon.stderr else ""
            raise CommandError(daemon.args, daemon.returncode, err, where="calibrate ssh")
        if f"{ADDR}:{PORT} " in proc.run(argv, timeout=10).stdout:
            return
        time.sleep(0.05)
    raise PreconditionError(f"sshd in namespace {ns} did not listen within {timeout:g} s")


def measure(
    ciphers: dict[str, str],
    env: dict[str, str],
    *,
    rounds: int,
    mib: int,
    say: Callable[[str], None] = lambda s: None,
) -> dict[str, list[dict]]:
    """{primitive: [one dict per round: bytes, elapsed_s, cpu_s, handshake_cpu_s]} for
    `ciphers` ({primitive: OpenSSH cipher name}), rounds interleaved across ciphers."""
    missing = missing_tools()
    if missing:
        raise PreconditionError(f"OpenSSH calibration needs {', '.join(missing)}; run ./setup.sh")
    netops.check_root()
    ns = f"calib-ssh-{os.getpid()}"
    sshd = proc.which("sshd") or "/usr/sbin/sshd"  # sshd re-execs itself: absolute path
    made_privsep = not os.path.isdir("/run/sshd")
    daemon = None
    ns_made = False
    tmp = tempfile.mkdtemp(prefix="lab-calib-ssh-")  # 0700
    state = Path(tmp)
    out: dict[str, list[dict]] = {p: [] for p in ciphers}
    try:
        for key in ("ssh_host_ed25519_key", "id_ed25519"):
            proc.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(state / key)])
        (state / "authorized_keys").write_text((state / "id_ed25519.pub").read_text())
        host_pub = (state / "ssh_host_ed25519_key.pub").read_text().split()
        (state / "known_hosts").write_text(f"{ADDR} {host_pub[0]} {host_pub[1]}\n")
        cfg = state / "sshd_config"
        cfg.write_text(sshd_config(addr=ADDR, port=PORT, state=state))
        for f in state.iterdir():
            f.chmod(0o600)
        if made_privsep:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        netops.create_netns(ns)
        ns_made = True
        proc.run(["ip", "-n", ns, "link", "set", "lo", "up"])
        daemon = proc.spawn(
            ["nsenter", f"--net={netops.NETNS_DIR / ns}", sshd, "-D", "-e", "-f", str(cfg)],
            env=env,
            stderr=subprocess.PIPE,
        )
        start = proc.proc_start_time(daemon.pid)
        _wait_listening(ns, daemon)
        payload = os.urandom(mib * MIB)
        for i in range(rounds):
            for prim, cipher in ciphers.items():
                argv = client_argv(ns, state, cipher)
                _, hs_cpu = _session(argv, b"", env)
                elapsed, cpu = _session(argv, payload, env)
                m = {
                    "bytes": len(payload),
                    "elapsed_s": round(elapsed, 4),
                    "cpu_s": round(cpu, 4),
                    "handshake_cpu_s": round(hs_cpu, 4),
                }
                m["cpu_mbps"] = round(per_cpu_second(len(payload), cpu, hs_cpu), 2)
                out[prim].append(m)
                say(f"round {i + 1}/{rounds} {prim} ({cipher}): {m['cpu_mbps']:.1f} MB/s per CPU s")
    finally:
        if daemon is not None:
            proc.stop_pid(daemon.pid, start)
            try:
                daemon.wait(timeout=5)
            except (subprocess.TimeoutExpired, ChildProcessError):
                pass
        if ns_made:
            try:
                netops.remove_netns(ns)
            except (OSError, LabError):
                pass
        if made_privsep:
            shutil.rmtree("/run/sshd", ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return out
