"""Unit tests of the VM substrate that need neither root nor QEMU: the initramfs archive, module
ordering, the QEMU command line, share planning, the agent's command runner and the host side of
the agent protocol (against an in-test fake agent)."""

from __future__ import annotations

import json
import shutil
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from lab.core.errors import PreconditionError
from lab.substrate.vm import agentcommands, kernel, qemu
from lab.substrate.vm.channel import Channel, ChannelClosed
from lab.substrate.vm.initramfs import Entry, newc, render_config
from lab.substrate.vm.booting import _emulator_panic, plan_shares
from lab.substrate.vm.machine import PANIC_LOGS, STATE_FILES, VM


# -- initramfs -------------------------------------------------------------------------------------
def test_newc_is_read_back_by_cpio(tmp_path):
    if not shutil.which("cpio"):
        pytest.skip("cpio(1) not installed")
    archive = newc(
        [
            Entry("bin", stat.S_IFDIR | 0o755),
            Entry("bin/hello", stat.S_IFREG | 0o755, b"#!/bin/sh\necho hi\n"),
            Entry("odd", stat.S_IFREG | 0o644, b"x" * 5),
        ]
    )
    assert len(archive) % 512 == 0
    listing = subprocess.run(
        ["cpio", "-itv"], input=archive, capture_output=True, check=True
    ).stdout.decode()
    assert "bin/hello" in listing and "odd" in listing
    subprocess.run(["cpio", "-id", "--quiet"], input=archive, cwd=tmp_path, check=True)
    assert (tmp_path / "bin/hello").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert (tmp_path / "odd").read_bytes() == b"xxxxx"


def test_newc_header_layout():
    archive = newc([Entry("a", stat.S_IFCHR | 0o600, rdev=(5, 1))])
    assert archive.startswith(b"070701")
    fields = [int(archive[6 + 8 * i : 14 + 8 * i], 16) for i in range(13)]
    ino, mode, *_ = fields
    assert ino == 1 and stat.S_ISCHR(mode)
    assert (fields[9], fields[10]) == (5, 1)  # rdevmajor, rdevminor
    assert fields[11] == 2  # "a\0"
    assert b"TRAILER!!!\0" in archive


def test_render_config_quotes_for_the_shell():
    cfg = render_config({"A": "plain", "B": "with space", "C": "it's", "D": "l1\nl2"})
    out = subprocess.run(
        ["sh", "-c", '. /dev/stdin; printf "%s|%s|%s|%s" "$A" "$B" "$C" "$D"'],
        input=cfg,
        capture_output=True,
        check=True,
    ).stdout.decode()
    assert out == "plain|with space|it's|l1\nl2"


# -- kernel -----------------------------------------------------------------------------------------
def _fake_kernel(tmp_path: Path) -> kernel.Kernel:
    rel = "6.12.0-test-amd64"
    k = kernel.Kernel(release=rel, root=tmp_path / rel, busybox=tmp_path / "busybox")
    k.modules_dir.mkdir(parents=True)
    (k.modules_dir / "modules.dep").write_text(
        "kernel/fs/9p/9p.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/fs/netfs/netfs.ko.xz\n"
        "kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/fs/netfs/netfs.ko.xz\n"
        "kernel/net/9p/9pnet.ko.xz: kernel/fs/netfs/netfs.ko.xz\n"
        "kernel/fs/netfs/netfs.ko.xz:\n"
        "kernel/fs/overlayfs/overlay.ko.xz:\n"
        "kernel/net/sched/sch-weird.ko.xz:\n"
    )
    (k.modules_dir / "modules.builtin").write_text("kernel/fs/fuse/virtiofs.ko\n")
    return k


def test_module_load_order_puts_dependencies_first(tmp_path):
    k = _fake_kernel(tmp_path)
    order = [p.name for p in kernel.module_load_order(k, ["9pnet_virtio", "9p", "overlay"])]
    assert order == [
        "netfs.ko.xz",
        "9pnet.ko.xz",
        "9pnet_virtio.ko.xz",
        "9p.ko.xz",
        "overlay.ko.xz",
    ]


def test_module_load_order_builtin_and_dash_names(tmp_path):
    k = _fake_kernel(tmp_path)
    assert kernel.module_load_order(k, ["virtiofs"]) == []
    assert [p.name for p in kernel.module_load_order(k, ["sch_weird"])] == ["sch-weird.ko.xz"]
    with pytest.raises(PreconditionError, match="no module 'nope'"):
        kernel.module_load_order(k, ["nope"])


def test_find_kernel_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_CACHE", str(tmp_path))
    with pytest.raises(PreconditionError, match="fetch-kernel.sh"):
        kernel.find_kernel()
    k = _fake_kernel(tmp_path / "kernel")
    (tmp_path / "kernel" / "current").symlink_to(k.release)
    with pytest.raises(PreconditionError, match="kernel image missing"):
        kernel.find_kernel()


# -- QEMU command line ------------------------------------------------------------------------------
def test_qemu_argv(tmp_path, monkeypatch):
    monkeypatch.delenv("LAB_VM_TCG_THREAD", raising=False)
    k = kernel.Kernel("6.12.0-t", tmp_path, tmp_path / "busybox")
    shares = plan_shares(tmp_path, None, {"/data": tmp_path})
    argv = qemu.qemu_argv(
        qemu="/usr/bin/qemu-system-x86_64",
        kernel=k,
        initramfs=tmp_path / "i.cpio",
        accel="tcg",
        mem_mb=1024,
        cpus=2,
        console_log=tmp_path / "con,sole.log",
        agent_sockets=[tmp_path / "agent.sock", tmp_path / "agent-1.sock"],
        pidfile=tmp_path / "qemu.pid",
        shares=shares,
    )

    def opt(flag):
        return [argv[i + 1] for i, a in enumerate(argv) if a == flag]

    assert opt("-machine") == ["q35"] and opt("-cpu") == ["max"]
    # single-threaded TCG: multi-threaded TCG races the guest's live kernel text patching
    assert opt("-accel") == ["tcg,thread=single"]
    assert {"-nographic", "-no-reboot", "-nodefaults"} <= set(argv)
    assert opt("-kernel") == [str(tmp_path / "boot" / "vmlinuz-6.12.0-t")]
    assert f"file,id=con,path={tmp_path}/con,,sole.log" in opt("-chardev")  # comma escaped
    assert f"socket,id=agent,path={tmp_path}/agent.sock,server=on,wait=on" in opt("-chardev")
    assert "virtserialport,bus=vser.0,chardev=agent,name=lab.agent" in opt("-device")
    # further ports: the guest runs without waiting for a client on them
    assert f"socket,id=agent1,path={tmp_path}/agent-1.sock,server=on,wait=off" in opt("-chardev")
    assert "virtserialport,bus=vser.0,chardev=agent1,name=lab.agent.1" in opt("-device")
    fsdevs = opt("-fsdev")
    assert fsdevs[0] == "local,id=fs0,path=/,security_model=none,multidevs=remap,readonly=on"
    assert all("readonly" not in f for f in fsdevs[1:])
    assert "virtio-9p-pci,fsdev=fs0,mount_tag=labroot" in opt("-device")
    assert "panic=-1" in opt("-append")[0]
    kvm = qemu.qemu_argv(
        qemu="q", kernel=k, initramfs=tmp_path, accel="kvm", mem_mb=1, cpus=1,
        console_log=tmp_path, agent_sockets=[tmp_path], pidfile=tmp_path, shares=[],
    )  # fmt: skip
    assert kvm[kvm.index("-accel") + 1] == "kvm"


def test_plan_shares(tmp_path):
    (tmp_path / "proj" / "runs").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    shares = plan_shares(
        tmp_path / "proj", tmp_path / "proj" / "runs", {"/mnt/d": tmp_path / "data"}
    )
    assert shares[0].tag == "labroot" and shares[0].readonly and shares[0].guest_path == "/"
    guests = [s.guest_path for s in shares[1:]]
    assert guests == ["/mnt/d", str(tmp_path / "proj"), str(tmp_path / "proj" / "runs")]
    assert [s.cache for s in shares[1:]] == ["mmap", "loose", "mmap"]  # project dir cached
    assert len({s.tag for s in shares}) == len(shares)
    assert all(len(s.tag) <= 31 for s in shares)  # virtio-9p mount tag limit
    with pytest.raises(PreconditionError, match="does not exist"):
        plan_shares(None, None, {"/x": tmp_path / "missing"})
    with pytest.raises(PreconditionError, match="absolute"):
        plan_shares(None, None, {"rel": tmp_path})
    with pytest.raises(PreconditionError, match="accepted values"):
        plan_shares(tmp_path, None, None, project_cache="always")


INT3_OOPS = """[    1.057902] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI
[    1.060264] RIP: 0010:enqueue_timer+0xa5/0x100
[    1.060406] Kernel panic - not syncing: Fatal exception in interrupt
"""
NO_INIT = "[    0.9] Kernel panic - not syncing: No working init found.\n"


@pytest.mark.parametrize(
    "accel, console, retried, again",
    [
        ("tcg", INT3_OOPS, 0, True),  # the emulator's stale translation: start once more
        ("tcg", INT3_OOPS, 1, False),  # only once
        ("kvm", INT3_OOPS, 0, False),  # a real CPU: the kernel's own bug, reported
        ("tcg", NO_INIT, 0, False),  # another panic: starting again cannot help
        ("tcg", "[    1.0] Oops: int3: 0000 [#1]\n", 0, False),  # oops survived: not a panic
        ("tcg", None, 0, False),  # no console at all
    ],
)
def test_boot_starts_again_only_after_an_emulator_panic(tmp_path, accel, console, retried, again):
    if console is not None:
        (tmp_path / "console.log").write_text(console)
    vm = VM(tmp_path, {"pid": 0, "accel": accel})
    assert _emulator_panic(vm, accel, retried) is again
    assert set(PANIC_LOGS) <= set(STATE_FILES)  # shutdown removes the kept consoles too


def test_probe_accel_without_kvm_device_is_tcg(monkeypatch):
    monkeypatch.delenv("LAB_VM_ACCEL", raising=False)
    monkeypatch.setattr(qemu.os, "access", lambda *a: False)
    assert qemu.probe_accel() == "tcg"
    monkeypatch.setenv("LAB_VM_ACCEL", "kvm")
    assert qemu.probe_accel() == "kvm"


# -- the agent's command runner ---------------------------------------------------------------------
def test_agent_run_request_basics():
    r = agentcommands.run_request(
        {"argv": ["sh", "-c", "cat; echo err >&2; exit 3"], "input": "in"}
    )
    assert (r["rc"], r["stdout"], r["stderr"], r["timed_out"]) == (3, "in", "err\n", False)
    r = agentcommands.run_request({"argv": ["sh", "-c", "echo $FOO $PATH"], "env": {"FOO": "bar"}})
    assert r["stdout"].startswith("bar /usr/local/sbin:")
    r = agentcommands.run_request({"argv": ["/nonexistent/tool"]})
    assert r["rc"] == 127 and "No such file" in r["stderr"]
    r = agentcommands.run_request({"argv": "ls"})
    assert r["rc"] == 127 and "argv" in r["stderr"]


def test_agent_timeout_kills_the_process_group():
    t = time.monotonic()
    r = agentcommands.run_request(
        {"argv": ["sh", "-c", "sleep 30 & sleep 30; echo never"], "timeout": 0.5}
    )
    # killed, not waited out: back before the 30 s sleeps would have ended
    assert r["timed_out"] and time.monotonic() - t < 30
    assert "never" not in r["stdout"]


# -- host side of the protocol ----------------------------------------------------------------------
class FakeAgent:
    """Speaks the agent protocol on a unix socket, answering in reverse order of arrival."""

    def __init__(self, path: Path, batch: int):
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(str(path))
        self.srv.listen(1)
        self.batch = batch
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        conn, _ = self.srv.accept()
        f = conn.makefile("rwb")
        f.write(b'{"event":"ready","kernel":"fake","uptime":1.0}\n')
        f.write(b'{"id":"stale-from-an-earlier-client","rc":0}\nnot json\n')
        f.flush()
        assert json.loads(f.readline())["op"] == "hello"  # a new client says so first
        reqs = [json.loads(f.readline()) for _ in range(self.batch)]
        for r in reversed(reqs):
            out = " ".join(r["argv"])
            f.write(json.dumps({"id": r["id"], "rc": 0, "stdout": out, "stderr": ""}).encode())
            f.write(b"\n")
            f.flush()
        conn.close()


def test_channel_matches_replies_to_concurrent_requests(tmp_path):
    path = tmp_path / "agent.sock"
    FakeAgent(path, batch=8)
    ch = Channel(path)
    assert ch.wait_event("ready", 5)["kernel"] == "fake"
    results = {}

    def ask(i):
        results[i] = ch.request({"op": "run", "argv": ["echo", str(i)]}, 10)["stdout"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: f"echo {i}" for i in range(8)}
    # the fake agent hung up: a further request fails clearly instead of hanging
    deadline = time.monotonic() + 5
    while not ch.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(ChannelClosed):
        ch.request({"op": "ping"}, 5)
    ch.close()
