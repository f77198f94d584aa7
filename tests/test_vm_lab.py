"""`lab up --vm`: the host CLI boots a VM, runs the lab in it, reaches into it with exec /
impair / status, and `lab down` leaves no QEMU process and no file behind.

One lab boots one VM (the CLI path itself is what is tested); a second, cut short by SIGKILL
while booting, proves the host ledger alone lets `lab down` stop QEMU. Skipped, naming what is
missing, without QEMU or the kernel cache (scripts/fetch-kernel.sh).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import secrets
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest

from lab.core import proc
from lab.core.errors import ConfigError, PreconditionError
from lab.core.state import Ledger, lab_dir
from lab.model.topology import load_topology
from lab.substrate.vm.lab import preflight
from tests.conftest import LAB, REPO, TOPOS, run_lab

# lab up --vm (400 s) then lab down (300 s) in one test, after the VM image is ready
pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(1000)]


@pytest.fixture
def vm_lab_id():
    lid = "k" + secrets.token_hex(3)
    yield lid
    if lab_dir(lid).exists():  # a failed test: never leave QEMU behind
        run_lab("down", "--id", lid, timeout=300)


def qemu_pids(lab_id: str) -> list[tuple[int, int]]:
    return [
        (e["pid"], e["start_time"])
        for e in Ledger(lab_dir(lab_id) / "ledger.jsonl").entries()
        if e["kind"] == "process" and e.get("name") == "qemu"
    ]


def test_macsec_mka_in_vm_end_to_end(vm_ready, vm_lab_id):
    lid = vm_lab_id
    cp = run_lab(
        "up",
        TOPOS / "pi_pair.py",
        "--vm",
        "--id",
        lid,
        "-p",
        "cpu=1",
        "--vpn",
        "macsec-gcm-aes-128",
        "--impair",
        "delay 5ms",
        "--json",
        timeout=400,
    )
    assert cp.returncode == 0, cp.stderr[-3000:]
    st = json.loads(cp.stdout)
    sub = st["substrate"]
    assert sub["kind"] == "vm" and sub["accelerator"] in ("tcg", "kvm") and sub["kernel"]
    if sub["accelerator"] == "tcg":
        assert sub["evidence"] == "functional" and "not" in sub["note"]
    v = st["vpn"]
    assert v["path"] == "kernel" and v["describe"]["cipher"] == "gcm-aes-128"
    assert v["describe"]["interface"].startswith("macsec") and v["describe"]["mtu"] == 1468
    assert st["impair"]["backend"] == "kernel-netem"
    ((pid, start),) = qemu_pids(lid)
    assert proc.is_same_process(pid, start)

    # exec reaches into the VM: the ping crosses MACsec, 2 x 5 ms of egress netem on the way
    cp = run_lab("exec", "--id", lid, "client", "--", "ping", "-c", "2", "-i", "0.3", "10.99.0.2")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    rtt = float(cp.stdout.split("rtt min/avg/max/mdev = ")[1].split("/")[1])
    assert rtt >= 10.0
    assert run_lab("exec", "--id", lid, "client", "--", "false").returncode == 1
    check_interactive(lid)

    # impair set/show are forwarded; the kernel reports what it applies
    cp = run_lab("impair", "set", "--id", lid, "all", "delay", "20ms")
    assert cp.returncode == 0, cp.stderr
    cp = run_lab("impair", "show", "--id", lid, "--json")
    assert cp.returncode == 0, cp.stderr
    applied = json.loads(cp.stdout)["applied"]
    # with the queue limit in force: 2 x 20 ms at 1 Gbit/s in 1500-byte packets (docs/impairment.md)
    assert set(applied.values()) == {"delay 20ms limit 3334"}, applied

    # the MKA-keyed frames on the wire are encrypted: the plaintext marker is absent
    from lab.substrate.vm import VM

    vm = VM.attach(lab_dir(lid) / "vm")
    try:
        r = vm.run(
            [sys.executable, str(REPO / "bench" / "vm_dataplanes.py"), "--capture", lid],
            timeout=120,
            cwd=str(REPO),
        )
    finally:
        vm.disconnect()
    cap = json.loads(r.stdout.strip().splitlines()[-1])
    assert cap["capture_bytes"] > 200 and cap["marker_seen"] is False, cap
    assert any("802.1AE" in line for line in cap["capture_head"]), cap["capture_head"]

    cp = run_lab("status", "--id", lid, "--json")
    assert cp.returncode == 0
    (s,) = json.loads(cp.stdout)
    assert (
        s["state"] == "up"
        and s["substrate"]["kind"] == "vm"
        and s["vpn"]["profile"] == "macsec-gcm-aes-128"
    )

    cp = run_lab("down", "--id", lid, timeout=300)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert not proc.is_same_process(pid, start), "QEMU outlived lab down"
    assert not lab_dir(lid).exists()
    assert "nothing to do" in run_lab("down", "--id", lid).stdout  # harmless twice


def check_interactive(lid: str) -> None:
    """exec and shell into the VM lab behave like local ones: stdin reaches the command, output
    streams, a terminal is a terminal (with the caller's window size), exit codes come back."""
    e = {**os.environ}
    cp = subprocess.run(
        [*LAB, "exec", "--id", lid, "client", "--", "sh", "-c", "cat; echo err >&2; exit 7"],
        input="hello from the host\n",
        capture_output=True,
        text=True,
        env=e,
        cwd=REPO,
        timeout=120,
    )
    assert (cp.returncode, cp.stdout, cp.stderr.strip()) == (7, "hello from the host\n", "err")
    cp = subprocess.run(
        [*LAB, "shell", "--id", lid, "client"],
        input="ip -o link show client-eth0 >/dev/null && echo $((6*7)); exit 3\n",
        capture_output=True,
        text=True,
        env=e,
        cwd=REPO,
        timeout=120,
    )
    assert cp.returncode == 3 and "42" in cp.stdout, cp.stdout + cp.stderr
    # a shell left open does not lock the lab: impair and exec still reach it meanwhile
    shell = subprocess.Popen(
        [*LAB, "shell", "--id", lid, "client"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=e,
        cwd=REPO,
    )
    try:
        shell.stdin.write("echo shell-is-open\n")
        shell.stdin.flush()
        assert shell.stdout.readline().strip() == "shell-is-open"
        # locked out, `lab exec` would fail after the VM's attach timeout (a non-zero exit)
        cp = subprocess.run(
            [*LAB, "exec", "--id", lid, "server", "--", "hostname"],
            capture_output=True, text=True, env=e, cwd=REPO, timeout=120,
        )  # fmt: skip
        assert cp.returncode == 0, cp.stdout + cp.stderr
        shell.stdin.write("exit 4\n")
        shell.stdin.flush()
        assert shell.wait(60) == 4
    finally:
        if shell.poll() is None:
            shell.kill()
            shell.wait()
    # on a terminal: a pty in the guest, with this terminal's size
    pid, fd = pty.fork()
    if pid == 0:  # child: give our terminal a size, then become `lab exec`
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))
        os.execvp(LAB[0], [*LAB, "exec", "--id", lid, "client", "--", "sh", "-c", "tty; stty size"])
    chunks = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            data = os.read(fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    text = b"".join(chunks).decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert "/dev/pts/" in text and "33 101" in text, text


def test_killed_vm_up_is_removed_by_down(vm_ready, vm_lab_id):
    """SIGKILL `lab up --vm` while the VM boots: the host ledger already names QEMU by PID."""
    lid = vm_lab_id
    p = subprocess.Popen(
        [*LAB, "up", str(TOPOS / "pi_pair.py"), "--vm", "--id", lid],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not (lab_dir(lid).exists() and qemu_pids(lid)):
        assert time.monotonic() < deadline and p.poll() is None, "QEMU never recorded"
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    ((pid, start),) = qemu_pids(lid)
    assert proc.is_same_process(pid, start)  # QEMU survives its parent...
    cp = run_lab("down", "--id", lid, timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert not proc.is_same_process(pid, start)  # ...but not `lab down`
    assert not lab_dir(lid).exists()


def test_macsec_refuses_a_routed_topology_before_booting():
    spec = load_topology(TOPOS / "pi_pair_middlebox.py", params={"cpu": None})
    with pytest.raises(ConfigError, match="pi_pair.py"):
        preflight(spec, "macsec-gcm-aes-128", None, None)
    preflight(
        load_topology(TOPOS / "pi_pair.py", params={"cpu": None}), "macsec-static", None, None
    )


def test_cli_refuses_before_creating_anything(vm_lab_id):
    cp = run_lab(
        "up",
        TOPOS / "pi_pair_middlebox.py",
        "--vm",
        "--id",
        vm_lab_id,
        "--vpn",
        "macsec-gcm-aes-128",
    )
    assert cp.returncode == ConfigError.exit_code and "layer 2" in cp.stderr
    assert not lab_dir(vm_lab_id).exists()
    cp = run_lab("up", TOPOS / "pi_pair.py", "--id", vm_lab_id, "--vpn", "gre")
    if cp.returncode != 0:  # this host has no GRE: the error says what to do
        assert cp.returncode == PreconditionError.exit_code and "--vm" in cp.stderr
    else:
        run_lab("down", "--id", vm_lab_id)
