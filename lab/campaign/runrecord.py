"""What a run records of itself in manifest.json (`RunRecord`, the Runner's half that writes it):
the session (command line, versions, kernel, substrate), each profile's tunnel and configs, the
nodes' CPU and tool versions, and each impairment point's counters after its cases ran."""

from __future__ import annotations

import time

from lab import __version__
from lab.campaign.setup import (
    arch_tool_versions,
    git_revision,
    kernel_info,
    node_tool_versions,
    tool_versions,
)
from lab.campaign.shard import shard_record, source_hash
from lab.core.errors import LabError
from lab.core.state import write_json_atomic
from lab.impair import runtime
from lab.model import dilation
from lab.model.impairment.points import ImpairmentPoint
from lab.results.rundir import RESULT_SCHEMA
from lab.vpn.record import TunnelRecord
from lab.vpn.tunnel import render


class RunRecord:
    """manifest.json of the run in `self.run_dir`; the Runner fills `self.manifest`."""

    # ------------------------------------------------------------------ manifest
    def _write_manifest(self) -> None:
        write_json_atomic(self.run_dir.file("manifest.json"), self.manifest)

    def init_manifest(self) -> None:
        m = self.run_dir.manifest()
        session = {
            "session": self.session,
            "command_line": self.argv,
            "started_utc": utc_now(),
            "lab_version": __version__,
            "git_revision": git_revision(),
            "kernel": kernel_info(),
            "substrate": self.target.describe(),
            "lab_id": self.lab_id,
            # a resumed shard may run newer code than its first session: lab merge checks each
            "source_sha256": source_hash(),
        }
        if not m:
            m = {
                "schema": RESULT_SCHEMA,
                "kind": "lab-run",
                "run": self.run_dir.name,
                "created_utc": session["started_utc"],
                "lab_version": __version__,
                "git_revision": session["git_revision"],
                "command_line": self.argv,
                "kernel": session["kernel"],
                "substrate": session["substrate"],
                "tool_versions": tool_versions(),
                "plan": self.plan.to_json(),
                "plan_digest": self.plan.digest(),
                "topology": self.spec.to_json(),
                "cpu": {},
                "profiles": {},
                "impairment": {},
                "sessions": [],
                # plan digest, code version, shard i/N, calibration: what `lab merge` checks
                **shard_record(self.shard, self.spec, session["git_revision"]),
            }
        m["sessions"].append(session)
        self.manifest = m
        self._write_manifest()

    def _record_profile(self, profile: str, lab) -> None:
        rec = TunnelRecord.of(lab)
        vpn = rec.to_dict() if rec else {}  # the manifest: an edge, in lab.json's form
        entry = self.manifest["profiles"].setdefault(profile, {})
        keys = ("driver", "path", "describe", "params", "timing", "tunnel", "traffic", "queues")
        entry.update({k: vpn.get(k) for k in keys})
        if "configs" not in entry:
            try:
                r = render(lab.spec, profile, show_secrets=False)
                entry["configs"] = {
                    "files": r["files"],
                    "config_hash": r["config_hash"],
                    "redacted": True,
                }
            except LabError as e:
                entry["configs"] = {"error": str(e)}
        self.manifest["cpu"] = {n: rt.get("cpu") for n, rt in lab.info.get("nodes", {}).items()}
        # what the substrate records of its labs (the boards; the boards' per-hop NIC latency
        # per direction, applied or why not: lab.substrate.local.cpuplan)
        self.manifest.update(self.target.lab_record(lab))
        self._record_node_tools(lab)
        self.manifest["lab_warnings"] = lab.info.get("warnings", [])
        self.manifest["dilation"] = dilation.factor(lab.spec.dilation)
        self._write_manifest()

    def _record_node_tools(self, lab) -> None:
        """`tool_versions` is this machine's; a board over SSH or a node of another architecture
        runs its own binaries: their versions, asked on each such node once per run."""
        # a board's tools are all its own; an arch node runs the board tools from its root,
        # the rest from this machine
        probes = {"own": node_tool_versions, "arch": arch_tool_versions}
        seen = self.manifest.setdefault("node_tool_versions", {})
        for name, which in self.target.tool_nodes(lab).items():
            if name not in seen:
                seen[name] = probes[which](lab.node(name))
        if not seen:
            del self.manifest["node_tool_versions"]

    def _record_after(self, pt: ImpairmentPoint) -> None:
        """The impairment's counters once the point's cases ran (losses really applied)."""
        if self.lab is None or not pt.impaired:
            return
        try:
            after = runtime.show_impairment(self.lab)
        except LabError as e:
            after = {"error": str(e)}
        profile = self._profile_up()
        self.manifest["impairment"].setdefault(pt.name, {}).setdefault(profile, {})["after"] = after
        self._write_manifest()


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
