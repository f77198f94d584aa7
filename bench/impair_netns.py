"""Throw-away namespaces for exercising the userspace impairment engine (benchmarks and tests).

    A-ns [<p>a0] ---veth--- [<p>m0] bump-ns (lab-impaird) [<p>m1] ---veth--- [<p>b0] B-ns
    DA-ns [<p>x0] ---veth--- [<p>y0] DB-ns                  (direct pair, for comparison)

Every name starts with a unique prefix `eng<hex>-`; everything created is recorded and removed in
reverse order by close() (namespaces take their veths with them). Processes are started through
lab.core.proc.spawn and stopped by PID. Needs root.
"""

from __future__ import annotations

import os
import secrets
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.impair.engine import EngineClient, engine_argv, probe_binary
from lab.core.proc import proc_start_time, run, spawn, stop_pid

A_IP, B_IP = "10.77.0.1", "10.77.0.2"
DA_IP, DB_IP = "10.78.0.1", "10.78.0.2"


@dataclass
class Started:
    pid: int
    start_time: int | None
    popen: subprocess.Popen


class EngineLab:
    """Context manager: namespaces + veths + (optionally) a running engine."""

    def __init__(
        self,
        *,
        direct: bool = False,
        engine: bool = True,
        rt_prio: int | None = None,
        engine_args: list[str] | None = None,
    ):
        self.p = f"eng{secrets.token_hex(2)}-"
        self.ns = {k: self.p + k for k in ("a", "m", "b")}
        if direct:
            self.ns.update({"da": self.p + "da", "db": self.p + "db"})
        self.created: list[str] = []
        self.procs: list[Started] = []
        self.tmp = tempfile.mkdtemp(prefix=self.p)
        self.control = os.path.join(self.tmp, "ctl.sock")
        self.want_engine = engine
        self.rt_prio = rt_prio
        self.engine_args = list(engine_args or [])
        self.engine: Started | None = None
        self.client = EngineClient(self.control)

    # -- setup -----------------------------------------------------------------------------
    def __enter__(self) -> EngineLab:  # noqa: PYI034
        try:
            self._build()
            if self.want_engine:
                self.start_engine()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def ip(self, *args: str, ns: str | None = None) -> None:
        argv = ["ip", *args] if ns is None else ["ip", "-n", ns, *args]
        run(argv, where=ns)

    def _ns(self, key: str) -> str:
        name = self.ns[key]
        self.created.append(name)  # recorded before creation: close() is harmless if it failed
        run(["ip", "netns", "add", name])
        self.exec(key, ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])
        self.exec(key, ["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"])
        self.ip("link", "set", "lo", "up", ns=name)
        return name

    def _veth(self, left: str, lkey: str, right: str, rkey: str) -> None:
        self.ip(
            "link",
            "add",
            left,
            "netns",
            self.ns[lkey],
            "type",
            "veth",
            "peer",
            "name",
            right,
            "netns",
            self.ns[rkey],
        )

    def _build(self) -> None:
        p = self.p
        for k in self.ns:
            self._ns(k)
        self._veth(p + "a0", "a", p + "m0", "m")
        self._veth(p + "m1", "m", p + "b0", "b")
        self.ip("addr", "add", f"{A_IP}/24", "dev", p + "a0", ns=self.ns["a"])
        self.ip("addr", "add", f"{B_IP}/24", "dev", p + "b0", ns=self.ns["b"])
        for dev, key in ((p + "a0", "a"), (p + "m0", "m"), (p + "m1", "m"), (p + "b0", "b")):
            self.ip("link", "set", dev, "up", ns=self.ns[key])
        if "da" in self.ns:
            self._veth(p + "x0", "da", p + "y0", "db")
            self.ip("addr", "add", f"{DA_IP}/24", "dev", p + "x0", ns=self.ns["da"])
            self.ip("addr", "add", f"{DB_IP}/24", "dev", p + "y0", ns=self.ns["db"])
            self.ip("link", "set", p + "x0", "up", ns=self.ns["da"])
            self.ip("link", "set", p + "y0", "up", ns=self.ns["db"])

    def exec(self, key: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return run(["ip", "netns", "exec", self.ns[key], *argv], where=self.ns[key], **kw)

    def spawn(self, key: str, argv: list[str], **kw) -> Started:
        # `ip netns exec` execs the command, so the PID is the tool's own.
        po = spawn(["ip", "netns", "exec", self.ns[key], *argv], **kw)
        st = Started(po.pid, proc_start_time(po.pid), po)
        self.procs.append(st)
        return st

    def start_engine(self, extra: list[str] | None = None) -> Started:
        argv = engine_argv(self.p + "m0", self.p + "m1", self.control, rt_prio=self.rt_prio)
        argv += self.engine_args + (extra or [])
        self.engine = self.spawn("m", argv, stderr=subprocess.PIPE)
        self.client.wait_ready(10, proc=self.engine.popen)
        return self.engine

    def stop(self, st: Started) -> None:
        stop_pid(st.pid, st.start_time)
        if st in self.procs:
            self.procs.remove(st)

    # -- teardown --------------------------------------------------------------------------
    def close(self) -> list[str]:
        leftovers = []
        for st in reversed(self.procs):
            if not stop_pid(st.pid, st.start_time):
                leftovers.append(f"pid {st.pid}")
            for f in (st.popen.stdout, st.popen.stderr):
                if f is not None:
                    f.close()
        self.procs.clear()
        for name in reversed(self.created):
            cp = run(["ip", "netns", "del", name], check=False)
            if cp.returncode != 0 and os.path.exists(f"/run/netns/{name}"):
                leftovers.append(f"netns {name}")
        self.created.clear()
        for f in ("ctl.sock",):
            try:
                os.unlink(os.path.join(self.tmp, f))
            except FileNotFoundError:
                pass
        for f in os.listdir(self.tmp) if os.path.isdir(self.tmp) else []:
            os.unlink(os.path.join(self.tmp, f))
        if os.path.isdir(self.tmp):
            os.rmdir(self.tmp)
        return leftovers

    # -- measurement helpers ---------------------------------------------------------------
    def warm(self, src: str = "a", dst_ip: str = B_IP) -> None:
        """Resolve ARP both ways so measured traffic is only probe datagrams."""
        self.exec(src, ["ping", "-c", "2", "-i", "0.05", "-W", "1", dst_ip], check=False)

    def probe(
        self,
        count: int,
        rate: float,
        size: int = 64,
        *,
        src: str = "a",
        dst: str = "b",
        dst_ip: str = B_IP,
        port: int = 7000,
        idle_ms: int = 600,
    ) -> list[tuple[int, int, int]]:
        """Send `count` UDP probes at `rate`/s from src to dst; return (seq, sent_ns, recv_ns)
        for every datagram received (duplicates included, arrival order)."""
        out = os.path.join(self.tmp, f"probe-{port}.bin")
        pb = probe_binary()
        rx = self.spawn(
            dst,
            [
                pb,
                "recv",
                "--bind",
                f"{dst_ip}:{port}",
                "--out",
                out,
                "--idle-ms",
                str(idle_ms),
                "--timeout",
                str(count / rate + 30),
            ],
            stdout=subprocess.PIPE,
        )
        deadline = time.monotonic() + 5
        while not os.path.exists(out + ".ready"):
            if time.monotonic() > deadline or rx.popen.poll() is not None:
                raise RuntimeError("lab-probe receiver did not start")
            time.sleep(0.01)
        self.exec(
            src,
            [
                pb,
                "send",
                "--to",
                f"{dst_ip}:{port}",
                "--count",
                str(count),
                "--rate",
                str(rate),
                "--size",
                str(size),
            ],
            timeout=count / rate + 30,
        )
        rx.popen.wait(timeout=count / rate + 60)
        self.procs.remove(rx)
        rx.popen.stdout.close()
        with open(out, "rb") as f:
            data = f.read()
        os.unlink(out)
        return list(struct.iter_unpack("<QQQ", data))


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all threads) from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        rest = f.read().rsplit(b")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    i = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[i]


def binom_interval(n: int, p: float, z: float = 2.576) -> tuple[float, float]:
    """Normal approximation of the 99 % interval of a Binomial(n, p) count."""
    sd = (n * p * (1 - p)) ** 0.5
    return n * p - z * sd, n * p + z * sd
