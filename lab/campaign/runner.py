"""Run a plan: bring each profile up, set each impairment point, run every test, store each result.

Phases per session: check (tools, profiles runnable here, leftovers of a killed session removed)
-> for each profile and impairment group: up the lab -> for each point: set the impairment -> run
the group's cases (monitors sampling) -> down. The lab is torn down in `finally`, with SIGINT
shielded so a second Ctrl-C cannot cut the teardown short. A case that fails (tool error, tunnel
that died, impairment that cannot be set) is recorded with its error and raw output and the run
carries on; a tunnel found dead is brought up again before the next case.

Nothing here prints: progress goes through a `RunEvents` object the CLI supplies.
Signals are lab.core.interrupts, the preflight, run directory and host facts lab.campaign.setup; their
names stay importable from here.
"""

from __future__ import annotations

import secrets
import time
import traceback
from pathlib import Path

from lab.model import dilation
from lab.core.errors import CommandError, LabError
from lab.core.interrupts import Interrupts
from lab.impair.queues import queued_packets
from lab.measure import TESTS, Context
from lab.campaign.plan import Case, Plan
from lab.model.impairment.points import ImpairmentPoint
from lab.model.impairment.points import slug
from lab.campaign.repstop import converged, skipped_record
from lab.campaign.runrecord import RunRecord, utc_now
from lab.results.rundir import RESULT_SCHEMA, RunDir
from lab.campaign.shard import case_id, case_seed, shard_cases
from lab.substrate.registry import select
from lab.core.state import lab_dir, new_lab_id, write_json_atomic
from lab.vpn.control import TunnelControl
from lab.vpn.record import TrafficTarget, TunnelRecord

RAW_TAIL_LINES = 30


class RunEvents:
    """What the runner reports while it works; the CLI draws a progress bar from it."""

    def start(self, *, total: int, skipped: int, estimate_s: float, run: RunDir) -> None: ...

    def phase(self, text: str) -> None: ...

    def case_start(self, case: Case, estimate_s: float) -> None: ...

    def case_done(self, case: Case, entry: dict, estimate_s: float) -> None: ...

    def note(self, text: str) -> None: ...


# ---------------------------------------------------------------------- the runner


class Runner(RunRecord):
    def __init__(
        self,
        plan: Plan,
        run: RunDir,
        events: RunEvents | None = None,
        argv: list[str] | None = None,
        target=None,
        shard=None,
    ):
        #: where labs are built: a lab.substrate.base.Substrate (this machine's by default)
        self.target = target or select()
        self.plan = plan
        self.run_dir = run
        self.events = events or RunEvents()
        self.argv = argv or []
        #: lab.campaign.shard.Shard: run only this part of the plan (`lab run --shard i/N`), else None
        self.shard = shard
        self.digest = plan.digest()
        self.session = secrets.token_hex(4)
        self.lab_id = new_lab_id("r")
        self.lab = None
        self.spec = None
        self.manifest: dict = {}
        self.counts = {"ok": 0, "failed": 0, "skipped": 0}
        self.interrupts = Interrupts(self.events.note)

    # ------------------------------------------------------------------ timeline
    def _event(self, event: str, **data) -> None:
        self.run_dir.event({"t": time.time(), "session": self.session, "event": event, **data})

    # ------------------------------------------------------------------ checks
    def preflight(self) -> None:
        """Everything that can be checked before anything is created."""
        self.spec = self.target.preflight(self.plan)

    def remove_leftovers(self) -> None:
        """Labs of earlier sessions of this run still present (a SIGKILLed `lab run`)."""
        ids = {e["lab_id"] for e in self.run_dir.load_timeline() if e.get("lab_id")}
        for lab_id in sorted(ids):
            if (lab_dir(lab_id) / "ledger.jsonl").exists():
                t0 = time.monotonic()
                left = self.target.down(lab_id)
                self._event(
                    "down",
                    lab_id=lab_id,
                    seconds=time.monotonic() - t0,
                    leftover=left,
                    reason="left by an earlier session",
                )
                self.events.note(
                    f"removed lab {lab_id} left by an earlier session"
                    + (f" (left over: {'; '.join(left)})" if left else "")
                )

    # ------------------------------------------------------------------ lab lifecycle
    def _up(self, profile: str, first: ImpairmentPoint | None):
        t0 = time.monotonic()
        self.events.phase(f"bringing up {profile}")
        try:
            lab = self.target.up(
                self.spec, self.lab_id, self.plan.loaded[profile], first, self.plan.placement
            )
        except LabError as e:
            self._event(
                "up",
                lab_id=self.lab_id,
                profile=profile,
                ok=False,
                error=str(e),
                seconds=time.monotonic() - t0,
            )
            raise
        self.lab = lab
        self._event(
            "up", lab_id=self.lab_id, profile=profile, ok=True, seconds=time.monotonic() - t0
        )
        self._record_profile(profile, lab)
        return lab

    def _down(self) -> None:
        if self.lab is None:
            return
        lab_id, self.lab = self.lab.id, None
        t0 = time.monotonic()
        with self.interrupts.shielded():
            left = self.target.down(lab_id)
            self._event("down", lab_id=lab_id, seconds=time.monotonic() - t0, leftover=left)
        if left:
            self.events.note(f"lab {lab_id} not fully removed: {'; '.join(left)}")
            self.lab_id = new_lab_id("r")  # the old id stays taken until someone cleans it

    def _tunnel_alive(self) -> bool:
        return self.target.tunnel_alive(self.lab)

    # ------------------------------------------------------------------ cases
    def _entry(self, case: Case, **data) -> dict:
        roles = {}
        if self.spec is not None:
            vc, vs = self.spec.endpoints("vpn")
            tc, ts = self.spec.endpoints("traffic")
            roles = {"vpn_client": vc, "vpn_server": vs, "traffic_client": tc, "traffic_server": ts}
        rec = TunnelRecord.of(self.lab) if self.lab is not None else None
        return {
            "schema": RESULT_SCHEMA,
            "case": case.key,
            "case_id": case_id(self.digest, case.key),
            "session": self.session,
            "lab_id": self.lab.id if self.lab is not None else None,
            "profile": case.profile,
            "vpn": {
                "driver": rec.driver if rec else None,
                "path": rec.path if rec else None,
                # the board kernel's queues its stand-in held (lab.model.dpqueue), per node
                **({"queues": held_queues(rec.queues)} if rec and rec.queues else {}),
            },
            "impairment": case.point.to_json(),
            "test": case.test.test,
            "label": case.test.label,
            "ip": case.test.ip,
            "rep": case.rep,
            "params": case.test.params,
            "roles": roles,
            **data,
        }

    def _raw_dir(self, case: Case) -> Path:
        return (
            self.run_dir.raw
            / slug(case.profile)
            / case.point.name
            / case.test.label
            / f"rep{case.rep}"
        )

    def _not_run(self, case: Case, error: str) -> dict:
        """The result of a case that could not be measured at all."""
        return self._entry(
            case,
            ok=False,
            error=error,
            started_utc=utc_now(),
            seconds=0.0,
            ended_t=time.time(),
            records=[],
            monitor={},
        )

    def _fail_all(self, cases: list[Case], error: str) -> None:
        for c in cases:
            entry = self._not_run(c, error)
            self.run_dir.add_result(entry)
            self.counts["failed"] += 1
            self.events.case_done(c, entry, self.plan.estimate_s(c))

    def run_case(self, case: Case, impairment_applied: dict | None) -> dict:
        lab = self.lab
        rec = TunnelRecord.of(lab)
        traffic = rec.traffic if rec and rec.traffic else TrafficTarget("", "")
        tc, ts = traffic.client or None, traffic.server or None
        iface = rec.interface if rec and tc == rec.client else None
        raw_dir = self._raw_dir(case)
        raw_dir.mkdir(parents=True, exist_ok=True)
        target = traffic.v4 if case.test.ip == 4 else traffic.v6
        if not target:
            # an IPv4-only tunnel (or topology) and a test entry with ip = 6: the case does not
            # apply, it does not fail (issue 32), and its row says why
            why = (
                f"ip = {case.test.ip}: the lab has no IPv{case.test.ip} traffic address "
                f"(profile {case.profile} or the topology carries no IPv{case.test.ip})"
            )
            return {
                **self._not_run(case, why),
                "ok": True,
                "error": None,
                "records": [TESTS[case.test.test].not_applicable(why, family=case.test.ip)],
            }
        d = dilation.factor(lab.spec.dilation)  # time dilation: parameters in, figures back
        link = None
        if rec and rec.tunnel and (tc, ts) == (rec.client, rec.server):
            link = rec.tunnel["server"].underlay_v4.split("/")[0] or None
        ctx = Context(
            client=lab.node(tc),
            server=lab.node(ts),
            server_addr=target,
            server_addr6=traffic.v6 or None,
            raw_dir=raw_dir,
            iface=iface,
            timeout_s=self.plan.timeout_s * d,
            state_dir=lab.dir / "measure",
            tunnel=TunnelControl(
                lab, self.plan.loaded[case.profile], queues=lambda: queued_packets(lab)
            )
            if case.profile in self.plan.loaded
            else None,
            link_addr=link if link != target else None,
        )
        test = TESTS[case.test.test]
        started = utc_now()
        mon = self.target.monitor(lab).start()
        t0 = time.monotonic()
        error, records, nic = None, [], {"applied": False}
        try:
            # the boards' NICs put in force for this test where the substrate does it per test
            with self.target.nic_steering(lab, test) as nic:
                records = test.run(ctx, dilation.dilate_params(case.test.params, d))
        except KeyboardInterrupt:
            mon.stop()
            raise
        except Exception as e:  # noqa: BLE001 -- the case fails, the campaign goes on
            error = f"{type(e).__name__}: {e}"
            self._write_error(raw_dir, e)
        seconds = time.monotonic() - t0
        # each record by its own test's metrics (contention's are the wrapped test's)
        records = [
            dilation.scale_back(r, TESTS.get(r.get("test"), test).metrics, d) for r in records
        ]
        summary = mon.stop()
        write_json_atomic(
            self.run_dir.path / "monitor" / f"{slug(case.key)}.json",
            {"case": case.key, "samples": mon.samples, "summary": summary},
        )
        for r in records:
            r["raw_files"] = [self.run_dir.rel(f) for f in r.get("raw_files") or []]
        ok = error is None and bool(records) and all(r.get("ok") for r in records)
        if error is None and not ok:
            error = (
                "; ".join(r.get("error") or "failed" for r in records if not r.get("ok"))
                or "the test returned no record"
            )
        entry = self._entry(
            case,
            ok=ok,
            error=error,
            started_utc=started,
            seconds=seconds,
            ended_t=time.time(),
            records=records,
            monitor=summary,
            raw_dir=self.run_dir.rel(raw_dir),
            target=target,
            impairment_applied=_slim(impairment_applied),
            nic_latency_applied=nic["applied"],
            **({"nic_latency_note": nic["note"]} if nic.get("note") else {}),
        )
        if not ok:
            entry["raw_tail"] = _raw_tails(raw_dir, self.run_dir)
        return entry

    def _write_error(self, raw_dir: Path, e: Exception) -> None:
        parts = [f"{type(e).__name__}: {e}"]
        if isinstance(e, CommandError):
            parts += ["--- stdout ---", e.stdout, "--- stderr ---", e.stderr]
        if not isinstance(e, LabError):
            parts += ["--- traceback ---", traceback.format_exc()]
        (raw_dir / "error.txt").write_text("\n".join(parts) + "\n")

    # ------------------------------------------------------------------ main loop
    def execute(self) -> dict:
        """Run every case not yet in results.jsonl. KeyboardInterrupt propagates after teardown."""
        self._event("session-start", lab_id=None, argv=self.argv)
        # the handlers stay in place through the final teardown: a Ctrl-C there only waits
        with self.interrupts:
            try:
                self.preflight()
                self.remove_leftovers()
                self.init_manifest()
                self._loop()
            finally:
                try:
                    self._down()
                finally:
                    self._event("session-end", counts=dict(self.counts))
        return dict(self.counts)

    def _loop(self) -> None:
        done = self.run_dir.finished_keys()
        cases = shard_cases(self.plan, self.shard)
        todo = [c for c in cases if c.key not in done]
        self.counts["skipped"] = len(cases) - len(todo)
        groups = []
        for profile in self.plan.profiles:
            for gname, pts in self.plan.groups():
                names = {p.name for p in pts}
                gcases = [c for c in todo if c.profile == profile and c.point.name in names]
                if gcases:
                    groups.append((profile, gname, pts, gcases))
        # the bar advances per finished case, so bring-ups are not part of its total
        est = sum(self.plan.estimate_s(c) for c in todo)
        self.events.start(
            total=len(todo), skipped=self.counts["skipped"], estimate_s=est, run=self.run_dir
        )
        for profile, gname, pts, gcases in groups:
            self._run_group(profile, gname, pts, gcases)
        self.interrupts.check()  # a lost raise during the last case still means "interrupted"

    def _run_group(
        self, profile: str, gname: str, pts: list[ImpairmentPoint], gcases: list[Case]
    ) -> None:
        built_impaired = gname == "impaired"
        first = next(p for p in pts if any(c.point == p for c in gcases))
        self.interrupts.check()
        try:
            self._up(profile, first if built_impaired else None)
        except LabError as e:
            self._fail_all(gcases, f"lab up with {profile} failed: {e}")
            return
        try:
            for pt in pts:
                pcases = [c for c in gcases if c.point == pt]
                if pcases:
                    self._run_point(profile, pt, pcases, built_impaired)
        finally:
            self._down()

    def _run_point(
        self, profile: str, pt: ImpairmentPoint, pcases: list[Case], built_impaired: bool
    ) -> None:
        applied = self._set_point(pt, built_impaired, pcases[0])
        if isinstance(applied, str):
            self._fail_all(pcases, applied)
            return
        for i, case in enumerate(pcases):
            self.interrupts.check()
            reps = converged(self.run_dir.load_results, case, self.plan.reps_for(case.test, pt))
            if reps is not None:  # adaptive: earlier repetitions agree (lab/campaign/repstop.py)
                entry = self._not_run(case, "")
                entry.update(ok=True, error=None, records=[skipped_record(case, reps)])
                entry["repetitions"] = reps
                self.run_dir.add_result(entry)
                self.counts["skipped"] += 1
                self.events.case_done(case, entry, self.plan.estimate_s(case))  # the bar advances
                continue
            if self.lab is None or not self._tunnel_alive():
                self.events.note(f"{profile}: tunnel down; bringing the lab up again")
                self._down()
                try:
                    self._up(profile, pt if built_impaired else None)
                except LabError as e:
                    self._fail_all(pcases[i:], f"lab up with {profile} failed: {e}")
                    return
                applied = self._set_point(pt, built_impaired, case)
                if isinstance(applied, str):
                    self._fail_all(pcases[i:], applied)
                    return
            est = self.plan.estimate_s(case)
            self.events.case_start(case, est)
            entry = self.run_case(case, applied)
            self.run_dir.add_result(entry)
            self.counts["ok" if entry["ok"] else "failed"] += 1
            self.events.case_done(case, entry, est)
        self._record_after(pt)

    def _profile_up(self) -> str:
        rec = TunnelRecord.of(self.lab)
        return rec.profile if rec else "?"

    def _set_point(self, pt: ImpairmentPoint, built_impaired: bool, first: Case) -> dict | str:
        """The applied impairment, or an error text for the point's cases. Its random draws are
        seeded from the id of the first case it serves (the same on every machine and cut)."""
        t0 = time.monotonic()
        try:
            seed = case_seed(self.digest, first.key) if pt.impaired else None
            applied = self.target.apply_point(
                self.lab, pt, built_impaired=built_impaired, seed=seed
            )
        except LabError as e:
            self._event(
                "impair", point=pt.name, ok=False, error=str(e), seconds=time.monotonic() - t0
            )
            return f"impairment {pt.name!r} could not be set: {e}"
        self._event("impair", point=pt.name, ok=True, seconds=time.monotonic() - t0)
        for w in applied.get("warnings", []):
            self.events.note(f"{pt.name}: {w}")
        per = self.manifest["impairment"].setdefault(pt.name, {})
        per[self._profile_up()] = applied
        self._write_manifest()
        return applied


def _slim(applied: dict | None) -> dict | None:
    """What a result line keeps of show_impairment (the manifest has all of it)."""
    if applied is None:
        return None
    keep = ("backend", "placement", "applied", "seed", "wire_packets", "warnings")
    return {k: applied[k] for k in keep if k in applied}


def _raw_tails(raw_dir: Path, run: RunDir) -> dict[str, str]:
    out = {}
    for p in sorted(raw_dir.rglob("*")):
        if p.is_file():
            lines = p.read_text(errors="replace").splitlines()
            out[run.rel(p)] = "\n".join(lines[-RAW_TAIL_LINES:])
    return out


def held_queues(queues: dict) -> dict:
    """lab.json's vpn.queues as a result line keeps them: per node the stand-in, the
    packets it held each way and whether charon's libipsec bounded its own queues (the
    sockets', devices' and library's detail stays in lab.json)."""
    return {
        node: {k: q.get(k) for k in ("daemon", "rx_packets", "tx_packets")}
        | ({"libipsec_bounded": q["libipsec"].get("bounded")} if q.get("libipsec") else {})
        for node, q in queues.items()
    }
