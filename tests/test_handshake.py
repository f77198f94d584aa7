"""The handshake test kind (lab/measure/handshake.py, lab/vpn/control.py).

Unit: the rekey's effect read from an interval series (dip, recovery, retransmits), the plan-time
refusal of a rekey on a profile that cannot be rekeyed (before anything is built), the drivers'
answers, a cold establishment and a rekey that fail being results, and a half-up tunnel being dead for the
runner. Root: WireGuard's cold establishment three times on a real lab (every restarted daemon
in the ledger, the old ones gone, nothing left after teardown), and a forced strongSwan ChaCha20
rekey under a running TCP flow that charon itself shows as a new CHILD_SA.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab.campaign.load import load_plan
from lab.core import proc
from lab.core.errors import ConfigError, StartupError
from lab.measure import get_test
from lab.measure.base import Context, MeasurementFailed
from lab.measure import handshake, iperf3
from lab.measure.handshake import rekey_effect, with_interval
from lab.measure.iperf3 import client_argv
from lab.vpn.control import Establishment, Quiet, open_connections, wait_quiet
from lab.vpn.profiles import load_profile

from .conftest import REPO, lab_traces, run_lab

HANDSHAKE = get_test("handshake")


def _series(bps: list[float], step: float = 0.5, retrans: list[int] | None = None) -> list[dict]:
    out = []
    for i, b in enumerate(bps):
        iv = {"start": i * step, "end": (i + 1) * step, "bps": b, "omitted": False}
        if retrans is not None:
            iv["retransmits"] = retrans[i]
        out.append(iv)
    return out


# ---------------------------------------------------------------------- the rekey's effect


def test_rekey_effect_dip_recovery_and_retransmits():
    # 100 until 2.5 s, the rekey at 2.6 s: 20, 50, then 95 (within 10 %) from 3.5 s
    bps = [100, 90, 110, 100, 105, 20, 50, 95, 100, 100]
    rtx = [0, 0, 1, 0, 0, 7, 3, 0, 2, 0]
    fx = rekey_effect(_series(bps), 2.6, keys_s=0.3, retransmits=_series(bps, retrans=rtx))
    assert fx["before_bps"] == 100  # median of the five whole intervals before 2.6 s
    assert fx["min_bps"] == 20
    assert fx["dip_pct"] == pytest.approx(80.0)
    assert fx["recovery_s"] == pytest.approx(3.5 - 2.6)
    assert fx["retransmits"] == 7 + 3  # the intervals from the trigger to the recovery
    assert fx["noise_pct"] == pytest.approx(10.0)  # 90 against 100, before any rekey


def test_rekey_effect_without_a_dip_recovers_at_once():
    fx = rekey_effect(_series([100, 100, 100, 98, 100, 100]), 1.2)
    assert fx["dip_pct"] == pytest.approx(2.0)
    assert fx["recovery_s"] == 0.0


def test_rekey_effect_a_late_low_interval_is_not_the_rekey():
    # the dip window is the trigger .. new keys + DIP_MARGIN_S: a low interval 3 s later is noise
    fx = rekey_effect(_series([100] * 6 + [30] + [100] * 3, step=1.0), 2.5, keys_s=0.1)
    assert fx["dip_pct"] == 0.0 and fx["recovery_s"] == 0.0


def test_rekey_effect_never_recovered():
    fx = rekey_effect(_series([100, 100, 100, 0, 10, 40]), 1.6)
    assert fx["dip_pct"] == 100.0
    assert fx["recovery_s"] is None


def test_rekey_effect_needs_intervals_on_both_sides():
    with pytest.raises(MeasurementFailed, match="before the rekey"):
        rekey_effect(_series([100, 100]), 0.2)
    with pytest.raises(MeasurementFailed, match="after the rekey"):
        rekey_effect(_series([100, 100]), 1.0)


def test_rekey_effect_skips_omitted_intervals():
    ivs = _series([5, 100, 100, 100, 100])
    ivs[0]["omitted"] = True
    assert rekey_effect(ivs, 1.5)["before_bps"] == 100


def test_with_interval_sets_iperf3_report_interval():
    argv = with_interval(client_argv("10.99.0.2", 5201, duration=6), 0.25)
    assert argv[argv.index("-i") + 1] == "0.25"
    assert argv.count("-i") == 1


# ---------------------------------------------------------------------- parameters and plans


def test_cold_and_rekey_both_off_is_refused():
    with pytest.raises(ConfigError) as e:
        HANDSHAKE.validate({"cold": False}, source="p.toml")
    assert e.value.field == "cold" and "rekey = true" in str(e.value)
    assert HANDSHAKE.needs(HANDSHAKE.validate({"rekey": True}, source="p")) == ("rekey",)
    assert HANDSHAKE.needs(HANDSHAKE.validate({}, source="p")) == ()


@pytest.mark.parametrize(
    "profile, ok",
    [
        ("wireguard", False),
        ("ipsec-chacha20poly1305", True),
        ("openvpn-tls", True),
        ("openvpn-aes256cbc-static", False),
        ("tinc", False),
        ("gre", False),
        ("baseline", False),
        ("l2tp-ipsec", True),
    ],
)
def test_rekey_support_per_profile(profile, ok):
    p = load_profile(profile)
    answer = p.driver.rekey_support(p.params)
    assert answer.ok is ok and answer.how


def _plan(tmp_path: Path, profiles: list[str], rekey: bool = True) -> Path:
    f = tmp_path / "hs.toml"
    f.write_text(
        f"profiles = {json.dumps(profiles)}\n"
        '[topology]\nfile = "topologies/pi_pair.py"\n'
        f'[[tests]]\ntest = "handshake"\nname = "hs"\nrekey = {str(rekey).lower()}\n'
    )
    return f


def test_plan_with_rekey_on_wireguard_is_refused_naming_file_profile_and_who_can(tmp_path):
    f = _plan(tmp_path, ["ipsec-chacha20poly1305", "wireguard"])
    with pytest.raises(ConfigError) as e:
        load_plan(f)
    msg = str(e.value)
    assert str(f) in msg and "tests[0].rekey" in msg
    assert "'wireguard'" in msg and "REKEY_AFTER_TIME" in msg
    can = msg.split("profiles that can: ")[1].split(", ")
    assert "ipsec-chacha20poly1305" in can and "openvpn-tls" in can
    assert "wireguard" not in can and "openvpn-aes256cbc-static" not in can


def test_plan_with_rekey_on_capable_profiles_loads(tmp_path):
    plan = load_plan(_plan(tmp_path, ["ipsec-chacha20poly1305", "openvpn-tls"]))
    assert plan.tests[0].params["rekey"] is True
    load_plan(_plan(tmp_path, ["wireguard"], rekey=False))  # cold only: any profile


def test_lab_run_refuses_the_plan_before_anything_is_built(tmp_path):
    state, runs = tmp_path / "state", tmp_path / "runs"
    f = _plan(tmp_path, ["openvpn-aes256cbc-static"])
    r = run_lab("run", f, "--out", runs / "x", env={"LAB_STATE_DIR": str(state)})
    assert r.returncode == 2, r.stderr
    assert "openvpn-aes256cbc-static" in r.stderr and "static-key mode" in r.stderr
    assert "profiles that can:" in r.stderr
    assert not (runs / "x").exists()
    assert not state.exists() or not any(state.iterdir())


# ---------------------------------------------------------------------- results and the runner


class _Tunnel:
    name = "fake"

    def __init__(self, est: Establishment, quiet: Quiet | None = None):
        self.est = est
        self.quiet = quiet or Quiet(True, 0.0)
        self.calls: list[str] = []

    def quiesce(self, *, timeout: float) -> Quiet:
        self.calls.append(f"quiesce {timeout:g}")
        return self.quiet

    def establish(self, *, cap_s: float, probe_s: float) -> Establishment:
        assert cap_s == 7 and probe_s == pytest.approx(0.005)
        self.calls.append("establish")
        return self.est


def _ctx(tmp_path, tunnel) -> Context:
    return Context(None, None, "10.99.0.2", tmp_path / "raw", tunnel=tunnel)


def test_a_cold_establishment_that_fails_is_a_result(tmp_path):
    est = Establishment(False, failed_after_s=7.1, error="no reply", not_restored="dead link")
    params = HANDSHAKE.validate({"timeout_s": 7}, source="t")
    [rec] = HANDSHAKE.run(_ctx(tmp_path, _Tunnel(est)), params)
    assert rec["ok"] is True
    assert rec["handshake_status"] == "failed after 7.1 s" and rec["handshake_completed"] == 0
    assert "handshake_ms" not in rec
    assert rec["error"].startswith("failed after 7.1 s: no reply") and "dead link" in rec["error"]


def test_a_cold_establishment_that_succeeds(tmp_path):
    params = HANDSHAKE.validate({"timeout_s": 7}, source="t")
    [rec] = HANDSHAKE.run(_ctx(tmp_path, _Tunnel(Establishment(True, ms=42.5))), params)
    assert rec["ok"] is True and rec["error"] is None
    assert rec["handshake_ms"] == 42.5 and rec["handshake_completed"] == 1


# ---------------------------------------------------------------------- a quiet path first


class _Clock:
    """A clock that only moves when the waiter sleeps (no real time in these tests)."""

    def __init__(self):
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def _answers(*rounds: list[str]):
    """A probe giving one answer per call, the last one from then on."""
    it = iter(rounds)
    last: list[str] = []

    def probe() -> list[str]:
        nonlocal last
        last = next(it, last)
        return last

    return probe


def test_a_quiet_path_costs_one_look():
    clock = _Clock()
    q = wait_quiet(
        {"a": _answers([]), "b": _answers([])}, timeout=5, clock=clock, sleep=clock.sleep
    )
    assert q == Quiet(True, 0.0, (), ()) and clock.sleeps == []


def test_waits_until_every_probe_is_quiet_in_the_same_round():
    clock = _Clock()
    tcp = _answers(["FIN-WAIT-1 x -> y (send-q 472)"], ["FIN-WAIT-1 x -> y (send-q 2)"], [])
    queue = _answers(["imp1:a2b (1850 packets)"], [], ["imp1:b2a (4 packets)"], [])
    q = wait_quiet(
        {"server tcp": tcp, "impairment queue": queue},
        timeout=10,
        poll_s=0.25,
        clock=clock,
        sleep=clock.sleep,
    )
    # round 2: the queue quiet, tcp not; round 3: tcp quiet, the queue not; round 4: quiet
    assert q.quiet and clock.sleeps == [0.25] * 3 and q.waited_s == pytest.approx(0.75)
    assert q.waited_for == (  # each thing once, as first seen, in order
        "server tcp: FIN-WAIT-1 x -> y (send-q 472)",
        "impairment queue: imp1:a2b (1850 packets)",
        "impairment queue: imp1:b2a (4 packets)",
    )
    assert q.still == ()


def test_the_wait_is_bounded_and_says_what_was_still_busy():
    clock = _Clock()
    q = wait_quiet(
        {"client tcp": _answers(["ESTAB a -> b (send-q 0)"])},
        timeout=1.0,
        poll_s=0.3,
        clock=clock,
        sleep=clock.sleep,
    )
    assert not q.quiet and q.still == ("client tcp: ESTAB a -> b (send-q 0)",)
    # never sleeps past the bound: 0.3 + 0.3 + 0.3 + 0.1
    assert sum(clock.sleeps) == pytest.approx(1.0) and q.waited_s == pytest.approx(1.0)


SS_TAN = """\
LISTEN     0      5             10.99.0.2:5201          0.0.0.0:*
FIN-WAIT-1 0      472           10.99.0.2:5201       10.99.0.1:38330
FIN-WAIT-2 0      0             10.99.0.2:5202       10.99.0.1:38331
TIME-WAIT  0      0             10.99.0.2:5201       10.99.0.1:38332
ESTAB      0      0              10.0.2.2:22           10.0.2.1:40000
LAST-ACK   1      1      [fd99::2]:5201          [fd99::1]:41000
SYN-SENT   0      1      [fe80::1%server-eth0]:5 [fe80::2%server-eth0]:6
"""


def test_open_connections_are_those_that_can_still_send_on_the_tunnel():
    got = open_connections(SS_TAN, ["10.99.0.1/24", "10.99.0.2/24", "fd99::1/64", "fd99::2/64"])
    assert got == [
        "FIN-WAIT-1 10.99.0.2:5201 -> 10.99.0.1:38330 (send-q 472)",
        "LAST-ACK [fd99::2]:5201 -> [fd99::1]:41000 (send-q 1)",
    ]
    assert open_connections(SS_TAN, ["10.0.2.1"]) == [
        "ESTAB 10.0.2.2:22 -> 10.0.2.1:40000 (send-q 0)"
    ]


def test_the_cold_establishment_waits_for_a_quiet_path_first(tmp_path):
    q = Quiet(True, 2.5, ("server tcp: FIN-WAIT-1 a -> b (send-q 472)",))
    tunnel = _Tunnel(Establishment(True, ms=42.5), q)
    params = HANDSHAKE.validate({"timeout_s": 7, "quiet_timeout_s": 12}, source="t")
    [rec] = HANDSHAKE.run(_ctx(tmp_path, tunnel), params)
    assert tunnel.calls == ["quiesce 12", "establish"]
    assert rec["quiet_wait_s"] == 2.5 and rec["quiet_status"] == "quiet"
    assert rec["quiet_waited_for"] == "server tcp: FIN-WAIT-1 a -> b (send-q 472)"


def test_a_path_still_busy_at_the_bound_is_recorded_and_still_measured(tmp_path):
    q = Quiet(False, 3.0, ("x: ESTAB a -> b (send-q 0)",), ("x: ESTAB a -> b (send-q 0)",))
    params = HANDSHAKE.validate({"timeout_s": 7, "quiet_timeout_s": 3}, source="t")
    [rec] = HANDSHAKE.run(_ctx(tmp_path, _Tunnel(Establishment(True, ms=42.5), q)), params)
    assert rec["quiet_status"] == "not quiet after 3.0 s: x: ESTAB a -> b (send-q 0)"
    assert rec["handshake_ms"] == 42.5


def test_quiet_timeout_0_does_not_wait(tmp_path):
    tunnel = _Tunnel(Establishment(True, ms=42.5))
    params = HANDSHAKE.validate({"timeout_s": 7, "quiet_timeout_s": 0}, source="t")
    [rec] = HANDSHAKE.run(_ctx(tmp_path, tunnel), params)
    assert tunnel.calls == ["establish"] and "quiet_status" not in rec


def test_queued_packets_reads_the_engines_queue_depth_and_netem_qlen():
    from lab.impair import queues

    shown = {
        "a2b": {"counters": {"queue_depth": 1850, "forwarded": 3}},
        "b2a": {"counters": {"queue_depth": 0}},
    }

    class _Client:
        def show(self):
            return shown

    lab = SimpleNamespace(info={"impair": {"backend": "userspace", "engines": [{"name": "imp1"}]}})
    orig = queues.engine_client
    queues.engine_client = lambda lab, eng: _Client()
    try:
        assert queues.queued_packets(lab) == {"imp1:a2b": 1850, "imp1:b2a": 0}
    finally:
        queues.engine_client = orig
    assert queues.queued_packets(SimpleNamespace(info={})) == {}
    tc = json.dumps(
        [
            {"kind": "tbf", "handle": "1:", "root": True, "qlen": 9},
            {"kind": "netem", "handle": "10:", "parent": "1:1", "qlen": 7, "backlog": 9100},
        ]
    )
    assert queues.netem_qlen(tc) == 7


def test_without_tunnel_control_the_case_fails(tmp_path):
    [rec] = HANDSHAKE.run(_ctx(tmp_path, None), HANDSHAKE.validate({}, source="t"))
    assert rec["ok"] is False and "tunnel control" in rec["error"]


class _Server:
    """The server node as the rekey's flow uses it: its iperf3 server spawned and stopped."""

    def __init__(self):
        self.spawned, self.stopped = [], []

    def spawn(self, name, argv, *, log):
        self.spawned.append(argv)
        return SimpleNamespace(name=name)

    def stop(self, daemon):
        self.stopped.append(daemon.name)


class _Rekeying(_Tunnel):
    """A tunnel whose rekey() answers `rekey` (evidence, or an exception to raise); its
    establish() (the restart after a failed rekey) is counted."""

    def __init__(self, rekey):
        super().__init__(Establishment(True, ms=30.0))
        self._rekey, self.restarts = rekey, 0

    def rekey_support(self):
        return SimpleNamespace(ok=True, how="test")

    def rekey(self, *, timeout):
        assert timeout == 7
        if isinstance(self._rekey, Exception):
            raise self._rekey
        return self._rekey

    def establish(self, *, cap_s, probe_s):
        self.restarts += 1
        return super().establish(cap_s=cap_s, probe_s=probe_s)


def _rekey_run(tmp_path, monkeypatch, tunnel, flow) -> dict:
    """One rekey-only repetition: a 3 s flow (`flow`: the client's iperf3 JSON, or the
    MeasurementFailed it raises), the rekey at its midpoint at once."""

    def client(ctx, argv, **kw):
        if isinstance(flow, Exception):
            raise flow
        return flow

    monkeypatch.setattr(iperf3, "wait_listening", lambda *a, **kw: None)
    monkeypatch.setattr(handshake, "run_client", client)
    monkeypatch.setattr(handshake, "flow_start", lambda *a, **kw: handshake.time.monotonic() - 1.5)
    params = HANDSHAKE.validate(
        {"cold": False, "rekey": True, "timeout_s": 7, "duration_s": 3}, source="t"
    )
    ctx = Context(None, _Server(), "10.99.0.2", tmp_path / "raw", tunnel=tunnel)
    [rec] = HANDSHAKE.run(ctx, params)
    # the receiver's JSON at the flow's report interval, bound to the tunnel address
    assert ctx.server.spawned == [
        ["iperf3", "-s", "-p", "5201", "-J", "-i", "0.5", "-B", "10.99.0.2"]
    ]
    assert ctx.server.stopped == ["iperf3-server-5201"]
    return rec


IPERF3_TCP = (REPO / "tests" / "data" / "iperf3_tcp_c2s.json").read_text()


def test_a_rekey_that_never_completes_is_a_result(tmp_path, monkeypatch):
    # the driver's StartupError: no new keys within timeout_s (openvpn "not up again after
    # 30 s after SIGUSR1"); the flow broke meanwhile
    never = StartupError("openvpn on client not up again after 7 s after SIGUSR1\nlog tail")
    tunnel = _Rekeying(never)
    rec = _rekey_run(tmp_path, monkeypatch, tunnel, MeasurementFailed("iperf3: timed out"))
    assert rec["ok"] is True
    assert rec["rekey_status"].startswith("failed after ")
    assert rec["rekey_status"].endswith(" s")
    assert rec["error"].startswith(f"rekey {rec['rekey_status']}: openvpn on client not up again")
    assert "log tail" not in rec["error"]  # the reason's first line only
    assert "started again" in rec["error"] and tunnel.restarts == 1
    assert "rekey_dip_pct" not in rec and "rekey_keys_s" not in rec


def test_a_failed_rekey_keeps_the_flow_figures_when_the_flow_ran_to_its_end(tmp_path, monkeypatch):
    tunnel = _Rekeying(StartupError("strongSwan: no new CHILD_SA 'lab' within 7 s of the rekey"))
    rec = _rekey_run(tmp_path, monkeypatch, tunnel, IPERF3_TCP)
    assert rec["ok"] is True and rec["rekey_status"].startswith("failed after ")
    assert rec["rekey_before_bps"] > 0 and rec["rekey_dip_pct"] is not None
    assert rec["intervals"] and "rekey_keys_s" not in rec


def test_a_rekey_the_tool_cannot_ask_for_still_fails_the_case(tmp_path, monkeypatch):
    from lab.core.errors import CommandError

    tunnel = _Rekeying(CommandError(["swanctl", "--rekey"], 1, "no vici socket"))
    rec = _rekey_run(tmp_path, monkeypatch, tunnel, IPERF3_TCP)
    assert rec["ok"] is False and "swanctl" in rec["error"] and tunnel.restarts == 0


def test_a_completed_rekey_reads_the_flow(tmp_path, monkeypatch):
    evidence = {"how": "swanctl --rekey", "before": "a/b", "after": "c/d", "seconds": 0.2}
    rec = _rekey_run(tmp_path, monkeypatch, _Rekeying(evidence), IPERF3_TCP)
    assert rec["ok"] is True and rec["error"] is None
    assert rec["rekey_status"] in ("recovered", "not recovered")
    assert rec["rekey_keys_s"] == 0.2 and rec["rekey_evidence"] == "swanctl --rekey: a/b -> c/d"
    assert rec["rekey_at_s"] == pytest.approx(1.5, abs=0.2)


def test_a_half_up_tunnel_is_dead_for_the_runner(tmp_path):
    from lab.substrate.local.substrate import LocalSubstrate

    (tmp_path / "lab.json").write_text("{}")
    vpn = {"profile": "wireguard", "driver": "wireguard", "client": "c", "server": "s"}
    lab = SimpleNamespace(dir=tmp_path, info={"vpn": {**vpn, "state": "starting"}})
    assert LocalSubstrate.tunnel_alive(None, lab) is False
    lab.info["vpn"]["state"] = "up"
    assert LocalSubstrate.tunnel_alive(None, lab) is True  # no daemons: nothing died


# ---------------------------------------------------------------------- real tunnels (root)

TOPO = REPO / "topologies" / "pi_pair_middlebox.py"


def _ledger_pids(lab_id: str) -> set[int]:
    from lab.core.state import lab_dir

    lines = (lab_dir(lab_id) / "ledger.jsonl").read_text().splitlines()
    return {e["pid"] for e in map(json.loads, lines) if e.get("kind") == "process" and "pid" in e}


@pytest.fixture
def hs_lab_id():
    lid = "h" + secrets.token_hex(3)
    yield lid
    from lab.core.teardown import teardown

    teardown(lid)
    assert lab_traces(lid) == []


@pytest.mark.root
@pytest.mark.skipif(
    not all(proc.which(t) for t in ("ip", "ping", "wireguard-go", "wg")),
    reason="needs ip, ping, wireguard-go and wg (./setup.sh)",
)
def test_wireguard_cold_establishment_three_times(hs_lab_id, tmp_path):
    from lab.model.topology import load_topology
    from lab.substrate.local import build as labmod
    from lab.vpn.control import TunnelControl
    from lab.vpn.record import TunnelRecord

    lab = labmod.up(load_topology(TOPO), hs_lab_id, vpn="wireguard")
    control = TunnelControl(lab, load_profile("wireguard"))
    client = lab.node("client")
    for _ in range(3):
        old = TunnelRecord.of(lab).daemons
        est = control.establish(cap_s=10, probe_s=0.005)
        assert est.ok, est.error
        assert 0 < est.ms < 10_000  # bounds of the mechanism (a reply, within the cap)
        new = TunnelRecord.of(lab).daemons
        assert new and {d.pid for d in new}.isdisjoint(d.pid for d in old)
        assert {d.pid for d in new} <= _ledger_pids(hs_lab_id)  # teardown knows them
        assert not any(proc.is_same_process(d.pid, d.start_time) for d in old)
        client.run(["ping", "-n", "-q", "-c", "1", "-W", "2", "10.99.0.2"])


def _installed_spis(node, conf: Path) -> set[str]:
    """charon's own view, asked with swanctl directly: the inbound SPIs of installed CHILD_SAs."""
    from lab.vpn import charon

    cp = node.run(
        ["swanctl", "--list-sas", "--raw", "--uri", charon.VICI_URI],
        env={"STRONGSWAN_CONF": str(conf)},
    )
    return set(_spi_in(cp.stdout))


def _spi_in(text: str) -> list[str]:
    out = []
    for part in text.split("spi-in=")[1:]:
        out.append(part.split()[0])
    return out


@pytest.mark.root
@pytest.mark.skipif(
    not all(proc.which(t) for t in ("ip", "ping", "iperf3", "ss", "swanctl")),
    reason="needs ip, ping, iperf3, ss and swanctl (./setup.sh)",
)
def test_strongswan_rekey_under_a_tcp_flow_installs_a_new_child_sa(hs_lab_id, tmp_path):
    from lab.model.topology import load_topology
    from lab.substrate.local import build as labmod
    from lab.vpn.control import TunnelControl

    profile = load_profile("ipsec-chacha20poly1305")
    lab = labmod.up(load_topology(TOPO), hs_lab_id, vpn=profile)
    server = lab.node("server")
    conf = lab.dir / "config" / "vpn" / "server" / "strongswan.conf"
    before = _installed_spis(server, conf)
    assert len(before) == 1
    ctx = Context(
        lab.node("client"),
        server,
        "10.99.0.2",
        tmp_path / "raw",
        timeout_s=15,
        tunnel=TunnelControl(lab, profile),
    )
    params = HANDSHAKE.validate(
        {"cold": False, "rekey": True, "duration_s": 4, "interval_s": 0.5}, source="t"
    )
    [rec] = HANDSHAKE.run(ctx, params)
    assert rec["ok"], rec["error"]
    after = _installed_spis(server, conf)
    assert after - before  # charon's own listing: a CHILD_SA with an SPI it did not have
    assert rec["rekey_dip_pct"] >= 0 and rec["rekey_before_bps"] > 0
    assert rec["rekey_evidence"].startswith("swanctl --rekey --child lab")
    # the flow's intervals cover the trigger
    assert rec["intervals"][0]["start"] < rec["rekey_at_s"] < rec["intervals"][-1]["end"]


def test_unsupported_not_applicable_lets_one_plan_hold_every_profile(tmp_path):
    f = _plan(tmp_path, ["ipsec-chacha20poly1305", "wireguard", "baseline"])
    f.write_text(f.read_text() + 'unsupported = "not-applicable"\n')
    plan = load_plan(f)
    assert plan.tests[0].params["unsupported"] == "not-applicable"
    assert HANDSHAKE.needs(plan.tests[0].params) == ()
    with pytest.raises(ConfigError) as e:
        HANDSHAKE.validate({"rekey": True, "unsupported": "skip"}, source="p.toml")
    assert e.value.field == "unsupported" and "not-applicable" in str(e.value)


def test_a_rekey_the_profile_cannot_do_is_not_applicable_after_the_cold_part(tmp_path):
    class Fixed(_Tunnel):
        def rekey_support(self):
            p = load_profile("wireguard")
            return p.driver.rekey_support(p.params)

        def rekey(self, *, timeout):
            raise AssertionError("no rekey may be tried")

    params = HANDSHAKE.validate(
        {"timeout_s": 7, "rekey": True, "unsupported": "not-applicable"}, source="t"
    )
    [rec] = HANDSHAKE.run(_ctx(tmp_path, Fixed(Establishment(True, ms=12.0))), params)
    assert rec["ok"] is True and rec["handshake_ms"] == 12.0
    assert rec["rekey_status"] == "not applicable"
    assert "REKEY_AFTER_TIME" in rec["not_applicable"]
