"""The full-kernel VM really boots here and gives the lab the kernel features this host lacks.

Skipped (naming what is missing) without QEMU or the kernel cache (scripts/fetch-kernel.sh).
One VM serves most tests of this module; two more boots check the failure paths and the cgroup
v1 layout + complete shutdown.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from .conftest import REPO

from lab.core import proc
from lab.core.errors import CommandError, StartupError
from lab.substrate.vm import VM, boot
from lab.substrate.vm.kernel import Kernel
from lab.substrate.vm.qemu import AGENT_PORTS
from tests.conftest import vm_kernel_or_skip

#: what boot() waits for a guest by default: a failure "at once" is one that does not wait it out
DEFAULT_BOOT_TIMEOUT = inspect.signature(boot).parameters["timeout"].default

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _kernel_or_skip() -> Kernel:
    return vm_kernel_or_skip()


def _assert_gone(vm: VM, state_dir: Path) -> None:
    assert not proc.is_same_process(vm.pid, vm.record["start_time"]), "QEMU still running"
    assert (
        not Path(f"/proc/{vm.pid}").exists()
        or proc.proc_start_time(vm.pid) != vm.record["start_time"]
    )
    assert not state_dir.exists(), f"left behind: {list(state_dir.iterdir())}"


@pytest.fixture(scope="module")
def kern():
    return _kernel_or_skip()


@pytest.fixture(scope="module")
def share_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("vmshare")


@pytest.fixture(scope="module")
def vm(kern, tmp_path_factory, share_dir):
    state = tmp_path_factory.mktemp("vm") / "state"
    machine = boot(state, mem_mb=1024, shares={"/mnt/lab-test": share_dir})
    yield machine
    machine.shutdown()
    _assert_gone(machine, state)


def sh(vm: VM, script: str, timeout: float = 60):
    return vm.run(["sh", "-euc", script], timeout=timeout)


def test_boot_and_run(vm, kern):
    cp = vm.run(["uname", "-r"])
    assert cp.returncode == 0 and cp.stdout.strip() == kern.release
    assert vm.accel in ("kvm", "tcg") and vm.boot_seconds and vm.boot_seconds > 0
    assert vm.console_log.exists() and "LAB-INIT-DONE" in vm.console_log.read_text()
    assert vm.run(["cat"], input="hello").stdout == "hello"
    assert vm.run(["sh", "-c", "echo $X"], env={"X": "y"}).stdout == "y\n"
    assert vm.run(["pwd"], cwd="/tmp").stdout == "/tmp\n"
    assert vm.run(["false"], check=False).returncode == 1
    with pytest.raises(CommandError) as e:
        vm.run(["sh", "-c", "echo bad >&2; exit 7"])
    assert (e.value.returncode, e.value.where) == (7, "vm") and "bad" in e.value.stderr
    with pytest.raises(CommandError, match="timed out"):
        vm.run(["sleep", "30"], timeout=1)


def test_guest_layout(vm):
    """Read-only host root under a tmpfs overlay; tmpfs where the lab writes; cgroup2."""
    mounts = vm.run(["cat", "/proc/mounts"]).stdout
    fstype = {line.split()[1]: line.split()[2] for line in mounts.splitlines()}
    assert fstype["/"] == "overlay"
    for d in ("/run", "/tmp", "/var/lib/lab", "/var/log"):
        assert fstype[d] == "tmpfs", d
    assert fstype["/sys/fs/cgroup"] == "cgroup2"
    assert fstype[str(REPO)] == "9p"
    # no udev, yet TUN and WireGuard autoload on first use, as on a normal system
    sh(vm, "ip tuntap add dev labt0 mode tun && ip link del labt0")
    sh(vm, "ip link add labwg0 type wireguard && ip link del labwg0")
    # writes to the root land in guest RAM, never on the host
    marker = f"/etc/lab-vm-test-{os.getpid()}"
    vm.run(["touch", marker])
    assert not Path(marker).exists()


def test_kernel_modules_the_host_lacks(vm):
    mods = ["sch_netem", "wireguard", "macsec", "esp4", "ip_gre", "ipip", "l2tp_eth"]
    vm.run(["modprobe", "-a", *mods])
    lsmod = vm.run(["cat", "/proc/modules"]).stdout
    for m in mods:
        assert f"{m} " in lsmod, m


def test_netns_veth_netem_and_wireguard(vm):
    sh(vm, """
        for n in a b; do ip netns add $n; ip -n $n link set lo up; done
        ip link add va netns a type veth peer name vb netns b
        ip -n a addr add 10.0.0.1/24 dev va; ip -n a link set va up
        ip -n b addr add 10.0.0.2/24 dev vb; ip -n b link set vb up
        ip netns exec a tc qdisc add dev va root netem delay 10ms
    """)  # fmt: skip
    qd = vm.run(["ip", "netns", "exec", "a", "tc", "qdisc", "show", "dev", "va"]).stdout
    assert "netem" in qd and "delay 10ms" in qd
    out = vm.run(["ip", "netns", "exec", "a", "ping", "-c", "3", "-i", "0.2", "10.0.0.2"]).stdout
    rtt_min = float(out.split("rtt min/avg/max/mdev = ")[1].split("/")[0])
    assert rtt_min >= 10.0, out

    if not proc.which("wg"):
        pytest.skip("wg (wireguard-tools) not installed on the host root")
    sh(vm, """
        ka=$(wg genkey); kb=$(wg genkey)
        pa=$(echo "$ka" | wg pubkey); pb=$(echo "$kb" | wg pubkey)
        echo "$ka" >/tmp/ka; echo "$kb" >/tmp/kb
        ip -n a link add wga type wireguard; ip -n b link add wgb type wireguard
        ip netns exec a wg set wga private-key /tmp/ka listen-port 51820 \
            peer "$pb" endpoint 10.0.0.2:51821 allowed-ips 10.9.0.2/32
        ip netns exec b wg set wgb private-key /tmp/kb listen-port 51821 \
            peer "$pa" endpoint 10.0.0.1:51820 allowed-ips 10.9.0.1/32
        ip -n a addr add 10.9.0.1/24 dev wga; ip -n a link set wga up
        ip -n b addr add 10.9.0.2/24 dev wgb; ip -n b link set wgb up
    """)  # fmt: skip
    vm.run(["ip", "netns", "exec", "a", "ping", "-c", "3", "-i", "0.2", "-W", "5", "10.9.0.2"])
    show = vm.run(["ip", "netns", "exec", "a", "wg", "show", "wga", "transfer"]).stdout
    rx, tx = (int(x) for x in show.split()[1:3])
    assert rx > 0 and tx > 0, show
    sh(vm, "ip netns del a; ip netns del b")


def test_concurrent_requests(vm):
    """Six requests that each wait in the guest until all six have started (a barrier): run one
    after another, the first would wait for the others until its timeout fails it. No clock is
    read, so a slow (TCG) or busy host cannot fail it."""
    vm.run(["sh", "-c", "rm -rf /tmp/barrier && mkdir /tmp/barrier"])
    barrier = (
        "touch /tmp/barrier/{0}; until [ $(ls /tmp/barrier | wc -l) -ge 6 ]; do sleep 0.1; done"
    )
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            cmd = barrier.format(i) + f"; echo {i}"
            results[i] = vm.run(["sh", "-c", cmd], timeout=120).stdout.strip()
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"requests ran one after another: {errors}"
    assert results == {i: str(i) for i in range(6)}


def test_shares_are_read_write(vm, share_dir):
    vm.run(["sh", "-c", "echo from-guest >/mnt/lab-test/out.txt"])
    assert (share_dir / "out.txt").read_text() == "from-guest\n"
    (share_dir / "in.txt").write_text("from-host\n")
    assert vm.run(["cat", "/mnt/lab-test/in.txt"]).stdout == "from-host\n"


def test_attach_from_a_second_client(vm):
    """A later process (e.g. `lab down`) reaches the same VM through its state directory."""
    vm.disconnect()
    other = VM.attach(vm.state_dir)
    assert other.pid == vm.pid
    assert other.run(["cat", "/proc/sys/kernel/hostname"]).stdout.strip() == "lab-vm"
    other.disconnect()
    assert vm.run(["true"]).returncode == 0  # the first client reconnects


def test_clients_at_once_each_get_a_port(vm):
    """`lab shell` open on a VM lab must not lock out `lab impair` or `lab exec`: every client
    holds one of the agent's ports; one too many waits, then fails naming the holders."""
    vm.disconnect()
    assert len(vm.agent_sockets) == AGENT_PORTS > 1
    clients = [VM.attach(vm.state_dir) for _ in range(AGENT_PORTS)]
    held = clients[0].start_stream(["sleep", "100"])  # an open shell, say
    try:
        for i, c in enumerate(clients):
            assert c.run(["echo", str(i)]).stdout == f"{i}\n"
        assert sorted(c._port_lock is not None for c in clients) == [True] * AGENT_PORTS
        extra = VM.attach(vm.state_dir)
        extra.attach_timeout = 1
        with pytest.raises(StartupError, match=f"all {AGENT_PORTS} agent channels"):
            extra.run(["true"])
        clients[1].disconnect()  # a port is free again: the waiting client gets it
        assert extra.run(["true"]).returncode == 0
        extra.disconnect()
        with pytest.raises(subprocess.TimeoutExpired):  # the others' coming and going left it be
            held.wait(0.5)
    finally:
        held.signal(signal.SIGTERM)
        held.wait(30)
        for c in clients:
            c.disconnect()
    assert vm.run(["true"]).returncode == 0


def test_project_venv_python_runs_in_the_vm(vm):
    venv_python = REPO / ".venv" / "bin" / "python"
    if not venv_python.exists():
        pytest.skip(f"{venv_python} missing (./setup.sh creates it)")
    out = vm.run(
        [str(venv_python), "-c", "import lab.substrate.vm, sys; print(sys.prefix)"], timeout=120
    )
    assert out.stdout.strip() == str(REPO / ".venv")


def test_orphans_are_reaped(vm):
    vm.run(["sh", "-c", "(sleep 0.2 &); (sleep 0.3 &); true"])
    deadline = time.monotonic() + 10
    while True:
        states = vm.run(["ps", "-eo", "stat="]).stdout.split()
        if not any(s.startswith("Z") for s in states) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not any(s.startswith("Z") for s in states), states


def test_stream_output_is_live_and_stdin_is_forwarded(vm):
    s = vm.start_stream(["sh", "-c", "echo a; read go; echo b $go >&2; cat; exit 3"])
    it = s.events(60)
    # "a" arrives while the command waits for our input: output is not held back until later
    assert next(it) == (1, b"a\n")
    s.write(b"go\n")
    assert next(it) == (2, b"b go\n")
    s.write(b"typed\n")
    assert next(it) == (1, b"typed\n")  # cat echoes it while still running
    s.close_stdin()
    assert list(it) == [] and s.returncode == 3


def test_stream_tty_size_resize_and_ctrl_c(vm):
    s = vm.start_stream(
        ["sh", "-c", "tty; stty size; read x; stty size; exec sleep 100"],
        tty=True,
        rows=33,
        cols=101,
    )
    it = s.events(60)
    text = b""
    while b"33 101" not in text:
        text += next(it)[1]
    assert text.startswith(b"/dev/pts/"), text
    s.resize(40, 120)
    time.sleep(0.5)
    s.write(b"\r")
    while b"40 120" not in text:
        text += next(it)[1]
    time.sleep(1)  # until `exec sleep` has happened
    s.write(b"\x03")  # Ctrl-C, turned into SIGINT by the guest's terminal
    assert s.wait(60) == 128 + signal.SIGINT


def _run_without_hello(vm: VM, argv: list[str]) -> dict:
    """One run request over a fresh connection that does not announce itself (no hello): the
    agent can only learn of the previous client's departure from the port's EOF."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(vm.agent_socket))
        s.sendall(json.dumps({"id": "raw", "op": "run", "argv": argv}).encode() + b"\n")
        f = s.makefile("rb")
        while True:
            msg = json.loads(f.readline())
            if msg.get("id") == "raw":
                return msg


def test_stream_signal_and_hangup_on_disconnect(vm):
    s = vm.start_stream(["sh", "-c", "sleep 100 & sleep 100"])
    time.sleep(0.5)
    s.signal(signal.SIGTERM)
    assert s.wait(60) == 128 + signal.SIGTERM

    script = "trap 'echo hup >/tmp/hup-{0}; exit 0' HUP; echo ready; while :; do sleep 0.2; done"
    # the client goes away and nothing reconnects for a while: the agent sees the port's EOF
    h = vm.start_stream(["sh", "-c", script.format("eof")], tty=True)
    assert b"ready" in next(h.events(60))[1]
    vm.disconnect()
    time.sleep(2)
    deadline = time.monotonic() + 30
    while _run_without_hello(vm, ["cat", "/tmp/hup-eof"])["stdout"] != "hup\n":
        assert time.monotonic() < deadline, "the stream was not hung up on EOF"
        time.sleep(0.5)
    # the next client connects at once (TCG may not even run the agent in between): its hello
    h = vm.start_stream(["sh", "-c", script.format("hello")])
    assert next(h.events(60)) == (1, b"ready\n")
    vm.disconnect()
    deadline = time.monotonic() + 30
    while vm.run(["cat", "/tmp/hup-hello"], check=False).stdout != "hup\n":
        assert time.monotonic() < deadline, "the stream was not hung up on the next hello"
        time.sleep(0.5)


def test_attach_in_pipe_mode(vm):
    from lab.substrate.vm.terminal import attach

    out, err = io.BytesIO(), io.BytesIO()
    rc = attach(vm, ["sh", "-c", "tr a-z A-Z; echo e >&2"], stdin=io.BytesIO(b"x\n"),
                stdout=out, stderr=err)  # fmt: skip
    assert (rc, out.getvalue(), err.getvalue()) == (0, b"X\n", b"e\n")


def test_agent_restart_fails_pending_requests_then_recovers(vm):
    # the command kills the agent that runs it; init restarts the agent within ~1 s
    with pytest.raises(CommandError, match="agent restarted"):
        vm.run(["sh", "-c", "kill -9 $PPID; sleep 5"], timeout=60)
    assert vm.run(["echo", "back"]).stdout == "back\n"


def test_hybrid_cgroups_and_clean_shutdown(kern, tmp_path):
    state = tmp_path / "vm"
    machine = boot(state, mem_mb=512, cpus=1, cgroup="hybrid", project_dir=None)
    try:
        assert machine.run(["test", "-f", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"]).returncode == 0
        assert machine.run(["test", "-f", "/sys/fs/cgroup/unified/cgroup.procs"]).returncode == 0
    finally:
        machine.shutdown()
    _assert_gone(machine, state)
    machine.shutdown()  # twice is harmless


def test_boot_failure_reports_qemu_and_console(kern, tmp_path):
    junk = tmp_path / "k" / "boot" / f"vmlinuz-{kern.release}"
    junk.parent.mkdir(parents=True)
    junk.write_bytes(b"not a kernel")
    bad = Kernel(release=kern.release, root=tmp_path / "k", busybox=kern.busybox)
    (tmp_path / "k" / "lib").symlink_to(kern.root / "lib")
    with pytest.raises(StartupError, match="did not come up") as e:
        boot(tmp_path / "vm", kernel=bad, accel="tcg", project_dir=None)
    assert "QEMU stderr" in str(e.value) and "console tail" in str(e.value)
    leftovers = {p.name for p in (tmp_path / "vm").iterdir()}
    assert leftovers <= {"console.log", "qemu.log"}, leftovers


def test_boot_timeout_kills_qemu(kern, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(StartupError, match="after 1 s"):
        boot(tmp_path / "vm", accel="tcg", project_dir=None, timeout=1)
    # it gave up on its 1 s, not on the default boot timeout
    assert time.monotonic() - t0 < DEFAULT_BOOT_TIMEOUT
    rec_pids = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
    for p in rec_pids:
        try:
            cmd = (p / "cmdline").read_bytes()
        except OSError:
            continue
        assert str(tmp_path / "vm").encode() not in cmd, f"QEMU {p.name} survived"


def test_init_failure_is_reported_at_once(kern, tmp_path):
    """A share that cannot be mounted stops the init, which powers off: no waiting for timeout."""
    t0 = time.monotonic()
    with pytest.raises(StartupError, match="LAB-INIT-FAILED mount share"):
        boot(tmp_path / "vm", accel="tcg", project_dir=None, shares={"/proc/lab-nope": tmp_path})
    assert time.monotonic() - t0 < DEFAULT_BOOT_TIMEOUT  # not waited out
