"""The tunnel record: what lab.vpn.tunnel.bring_up started in a lab and how (profile, driver,
daemons, addresses, traffic target, timing, the driver's describe()).

A dataclass everywhere in the code; a dict only at the edges, through to_dict()/from_dict():
lab.json (lab.info["vpn"], written by `store`), `lab status --json` and the run manifest.
from_dict reads every lab.json written so far: a key it does not know is kept in `extra` and
written back unchanged, a record cut short by a crash during bring-up (state "starting") lacks
the fields of a tunnel that came up.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from lab.core.node import Daemon


@dataclass
class DaemonRecord:
    """A daemon the driver started (its PID is in the ledger too)."""

    node: str
    name: str
    pid: int
    start_time: int | None = None
    log: str | None = None

    @classmethod
    def of(cls, d: Daemon) -> DaemonRecord:
        return cls(d.node, d.name, d.pid, d.start_time, str(d.log) if d.log else None)

    def to_dict(self) -> dict[str, Any]:
        """The lab.json form (what the monitors take)."""
        return asdict(self)

    def daemon(self) -> Daemon:
        return Daemon(
            self.node, self.name, self.pid, self.start_time, Path(self.log) if self.log else None
        )


@dataclass
class TunnelEnd:
    """One end of the tunnel: its node, tunnel addresses, underlay address and the networks
    behind it that the tunnel carries."""

    node: str
    v4: str
    v6: str
    underlay_v4: str
    behind: list[str] = field(default_factory=list)


@dataclass
class TrafficTarget:
    """Where the measurement tests run: client and server nodes, the addresses the client
    targets (the server's tunnel address, or a host behind it); None: no such family."""

    client: str
    server: str
    v4: str | None = None
    v6: str | None = None


@dataclass
class Timing:
    """Seconds from bring_up's start; ready_monotonic lets a caller that noted time.monotonic()
    before `lab up` compute "up to first packet through the tunnel"."""

    start_s: float
    ready_s: float
    ready_v6_s: float | None
    ready_monotonic: float
    #: ms from the driver's start() (daemons launched, configs already written) to the first
    #: reply through the tunnel: the cold establishment the `handshake` test reports (absent
    #: from lab.json files written before it)
    established_ms: float | None = None


@dataclass(kw_only=True)  # fields in lab.json's order
class TunnelRecord:
    profile: str
    driver: str
    state: str = "starting"  # "up" once traffic passed the tunnel
    params: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    client: str  # the VPN client's node
    server: str
    daemons: list[DaemonRecord] = field(default_factory=list)
    # filled once the tunnel is up:
    describe: dict[str, Any] | None = None  # the driver's describe(): free-form per driver
    path: str | None = None  # the data plane used
    tunnel: dict[str, TunnelEnd] | None = None  # "client"/"server"
    traffic: TrafficTarget | None = None
    timing: Timing | None = None
    configs: list[str] | None = None  # "node/file" of every rendered config
    #: node -> the board's data plane queues its stand-in was given (Node.hold_dataplane_queues)
    queues: dict[str, Any] | None = None
    #: keys of lab.json this version does not know, kept so that they are written back
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def interface(self) -> str | None:
        """The tunnel interface on the client (describe()'s "interface")."""
        return (self.describe or {}).get("interface")

    # ------------------------------------------------------------------ the edges
    def to_dict(self) -> dict[str, Any]:
        """The lab.json form (the keys lab.info["vpn"] always had; unset ones left out)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "extra":
                continue
            v = getattr(self, f.name)
            if v is None and f.name in _LATE:
                continue
            if f.name == "tunnel" and v is not None:
                v = {k: asdict(e) for k, e in v.items()}
            elif f.name == "daemons":
                v = [d.to_dict() for d in v]
            elif f.name in ("traffic", "timing") and v is not None:
                v = asdict(v)
                if f.name == "timing" and v["established_ms"] is None:
                    del v["established_ms"]  # a lab.json from before it reads back unchanged
            out[f.name] = v
        return {**self.extra, **out}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TunnelRecord:
        known = {f.name for f in fields(cls)} - {"extra"}
        kw = {k: v for k, v in d.items() if k in known}
        kw["daemons"] = [DaemonRecord(**x) for x in d.get("daemons") or []]
        if d.get("tunnel") is not None:
            kw["tunnel"] = {k: TunnelEnd(**e) for k, e in d["tunnel"].items()}
        if d.get("traffic") is not None:
            kw["traffic"] = TrafficTarget(**d["traffic"])
        if d.get("timing") is not None:
            kw["timing"] = Timing(**d["timing"])
        return cls(**kw, extra={k: v for k, v in d.items() if k not in known})

    @classmethod
    def of(cls, lab) -> TunnelRecord | None:
        """The lab's tunnel (from its lab.json), None when it has none."""
        d = lab.info.get("vpn")
        return cls.from_dict(d) if d else None

    def store(self, lab) -> None:
        """Into the lab's lab.json (lab.info["vpn"], saved)."""
        lab.info["vpn"] = self.to_dict()
        lab.save()


#: fields a record has only once its tunnel is up (left out of lab.json before)
_LATE = ("describe", "path", "tunnel", "traffic", "timing", "configs", "queues")


def half_up(lab) -> bool:
    """The lab has a tunnel record that never reached "up" (a bring-up that failed and left it
    behind, e.g. a `handshake` test's restart that could not restore the tunnel): no daemon
    check can make that tunnel alive."""
    rec = TunnelRecord.of(lab)
    return rec is not None and rec.state != "up"


def daemons_of(lab) -> list[DaemonRecord]:
    """The VPN daemons the lab's tunnel started (none without a tunnel)."""
    rec = TunnelRecord.of(lab)
    return rec.daemons if rec else []
