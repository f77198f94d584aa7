"""The one interface every substrate implements: where a lab runs (this machine's namespaces, the
full-kernel VM, boards over SSH) behind `Substrate`, and a running lab behind `LabHandle`.

A substrate answers every question the layers above would otherwise ask by kind: how to build a
lab (`bring_up`), how to open and remove one of its labs, what the plan's
runner needs (`preflight`, `up`, `down`, `tunnel_alive`, `monitor`, `nic_steering`, `describe`,
`lab_record`, `tool_nodes`), and its capabilities (`runs_whole_plan`, `supports_shards`, `supports_jobs`). The
CLI, the runner, the report and compare hold a Substrate or a LabHandle and never ask which kind
it is; lab.substrate.registry is the one place that lists the kinds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from lab.core.errors import ConfigError, LabError, PreconditionError
from lab.impair import runtime


class LabHandle(ABC):
    """A running lab, whatever it runs on: what `lab status/exec/shell/impair/down` call."""

    def __init__(self, lab_id: str):
        self.id = lab_id

    def up_note(self, status: dict, seconds: float) -> str:
        """How the bring-up went, for the user: "in 0.41 s", "in a VM in 9.2 s (boot 4.1 s)"."""
        return f"in {seconds:.2f} s"

    @abstractmethod
    def status(self) -> dict:
        """`lab status --json` of this lab: id, state, topology, nodes, substrate, ..."""

    @abstractmethod
    def exec(self, node: str, argv: list[str]) -> int:
        """Run `argv` in host node `node` attached to this terminal (or these pipes); exit code."""

    @abstractmethod
    def shell(self, node: str) -> int:
        """An interactive shell in `node`; its exit code."""

    @abstractmethod
    def impair(self, action: str, spec: str = "", target: str | None = None) -> dict:
        """action "set" (tc-netem words on `target`: a link, NODE:IFACE, or None for all),
        "clear" or "show"; returns what the backend reports as applied (show_impairment)."""

    @abstractmethod
    def down(self, notes: list[str]) -> list[str]:
        """Remove exactly what the lab created; notes get what the user should know; returns
        what is left over."""


class DrivenLab(LabHandle):
    """A LabHandle over a lab object this process drives itself (namespaces here, boards over
    SSH): opened from its records on first use (`opener`), its status that object's."""

    #: the lab class whose `open(lab_id)` reads a lab that is up
    opener: ClassVar[Any]

    def __init__(self, lab_id: str, lab=None):
        super().__init__(lab_id)
        self._lab = lab

    @property
    def lab(self):
        if self._lab is None:
            self._lab = self.opener.open(self.id)
        return self._lab

    def status(self) -> dict:
        try:
            return self.lab.status()
        except LabError as e:
            return {"id": self.id, "state": f"broken ({e}); run `lab clean`"}


def impair_on(lab, action: str, spec: str = "", target: str | None = None) -> dict:
    """LabHandle.impair for a lab object this process drives itself (namespaces here, or
    boards over SSH): the run-time impairment calls, on that lab."""
    if action == "set":
        return runtime.set_impairment(lab, spec, target)
    if action == "clear":
        return runtime.clear_impairment(lab)
    return runtime.show_impairment(lab)


@dataclass
class UpRequest:
    """What `lab up` asks of any substrate, besides the topology: the lab's id, its tunnel and
    impairment. `topology_file` and `guest_args` (the words a guest's own `lab up` needs) are
    for a substrate that re-loads the topology elsewhere (the VM)."""

    lab_id: str | None = None
    vpn: str | None = None
    impair: str | None = None
    placement: str | None = None
    impair_backend: str = "auto"
    topology_file: str | None = None
    guest_args: list[str] = field(default_factory=list)


class Substrate(ABC):
    """Where labs run. One instance carries its own options (an inventory, VM memory)."""

    #: the registry's name for it, also the `kind` of its labs' substrate record
    name: ClassVar[str]
    #: what the user asks for it with (error messages): "--vm", "--boards INVENTORY"
    flag: ClassVar[str | None] = None
    #: the whole plan runs there, with a runner of its own (results come back into the run)
    runs_whole_plan: ClassVar[bool] = False
    #: `lab run --shard i/N` can run its cases there
    supports_shards: ClassVar[bool] = True
    #: `lab run --jobs N` can run several labs of one plan there at once
    supports_jobs: ClassVar[bool] = False
    #: `lab clean` removes labs of lower rank first (boards before the farm that may host them)
    removal_rank: ClassVar[int] = 1

    # ------------------------------------------------------------------ labs by id
    @classmethod
    @abstractmethod
    def open_lab(cls, lab_id: str) -> LabHandle:
        """The handle of a lab of this substrate that is up."""

    @classmethod
    @abstractmethod
    def remove_lab(cls, lab_id: str, notes: list[str]) -> list[str]:
        """Tear lab `lab_id` down from its ledger alone (`lab clean`); what is left over."""

    @classmethod
    def kept_by_clean(cls) -> dict[str, str]:
        """{lab id: why} of labs `lab clean` keeps unless told otherwise (`--farms`)."""
        return {}

    @classmethod
    def status_line(cls, substrate: dict) -> str | None:
        """One line on what a lab runs on, for `lab status`/`lab up` and the report, when the
        user should know it (its substrate record `substrate`); None when there is nothing to
        say."""
        return None

    @classmethod
    def report_rows(cls, substrate: dict) -> list[list[str]]:
        """Rows of a run report's set-up table on what the run ran on (its substrate record)."""
        return []

    @classmethod
    def report_warnings(cls, substrate: dict) -> list[str]:
        """Warnings a run report opens with because of what the run ran on."""
        return []

    # ------------------------------------------------------------------ lab up
    @abstractmethod
    def bring_up(self, spec, request: UpRequest) -> tuple[LabHandle, dict, list[str]]:
        """Build `spec` here: (handle, status, lines for the user's stderr). Bad input is
        refused before anything is created and a failure unwinds what was built."""

    # ------------------------------------------------------------------ lab run
    def preflight(self, plan):
        """The plan's topology spec once the plan can run here (PreconditionError else)."""
        raise self._no_runner()

    def describe(self) -> dict:
        """The substrate record of a run's session (manifest `sessions[].substrate`)."""
        return {"kind": self.name}

    def up(self, spec, lab_id: str, profile: str, point, placement):
        """One profile's lab for the runner, impairment points in place, none applied yet."""
        raise self._no_runner()

    def apply_point(self, lab, point, *, built_impaired: bool, seed: int | None = None) -> dict:
        """Put impairment point `point` in place on a running lab built by `up`; returns what
        is really applied (show_impairment), PreconditionError when it is not in force."""
        if not built_impaired and not point.impaired:
            return {"requested": "", "applied": "none (lab built without impairment)"}
        # exactly the point's own impairment, whatever earlier points left (set_point, not the
        # shell's merge rule); what is recorded is read back from the engine or qdisc
        shown = runtime.set_point(lab, point.impairment, seed=seed)
        if not shown.get("in_force"):
            raise PreconditionError(
                f"impairment {point.name!r} is not in force: expected {shown.get('expected')}, "
                f"the {shown.get('backend')} backend reports {shown.get('applied')}"
            )
        return {"requested": point.spec, **shown}

    def down(self, lab_id: str) -> list[str]:
        """Remove a lab the runner built; what is left over."""
        raise self._no_runner()

    def owns(self, lab_id: str) -> bool:
        """A leftover lab of an earlier session of the run is this substrate's to remove."""
        raise self._no_runner()

    def tunnel_alive(self, lab) -> bool:
        """Every VPN daemon of `lab` is still the process that was started."""
        raise self._no_runner()

    def monitor(self, lab):
        """The resource monitor sampled while a test runs on `lab` (start() / stop())."""
        raise self._no_runner()

    @contextmanager
    def nic_steering(self, lab, test) -> Iterator[dict[str, Any]]:
        """Around one run of `test` on `lab`: the boards' NIC latency put in force for that test
        where this substrate does so per test (the local substrate's side path,
        lab.substrate.local.nicside), and taken off after, whatever happens. Yields what the
        result records of it: {"applied": ..., "note": ... (when there is one)}, "applied" being
        results.jsonl's nic_latency_applied. Here nothing is steered: not applied."""
        yield {"applied": False}

    def lab_record(self, lab) -> dict[str, Any]:
        """What the run manifest records of a lab built here beyond its nodes' CPU: e.g. the
        boards it ran on; the per-hop NIC latency when the substrate decides it; the lab's CPU
        weight (lab.core.cgroups.weigh_lab) where its nodes are cgroups."""
        return {
            "nic_latency": lab.info.get("nic_latency"),
            "cpu_weight": lab.info.get("cpu_weight"),
        }

    def tool_nodes(self, lab) -> dict[str, str]:
        """{node: "own" | "arch"}: nodes whose tool versions differ from this machine's, "own"
        for a node with every tool its own (a board), "arch" for one running a board's
        binaries from a foreign-architecture root (the board tools only)."""
        return {n: "arch" for n, rt in lab.info.get("nodes", {}).items() if rt.get("arch")}

    def run_plan(self, plan, run, plan_path, **kw) -> tuple[int, list[str], list[str]]:
        """(runs_whole_plan) run the whole plan there: (exit code, left over, notes)."""
        raise ConfigError(f"a whole plan cannot be handed to substrate {self.name!r}", field="on")

    def _no_runner(self) -> Exception:
        return ConfigError(f"substrate {self.name!r} runs whole plans only", field="on")
