"""lab.vpn.record.TunnelRecord: lab.json's "vpn" record as a dataclass, written back unchanged.

tests/data/labjson_vpn_wireguard-go.json is the "vpn" record of a lab.json that `lab up
topologies/pi_pair_middlebox.py --vpn wireguard:implementation=wireguard-go` wrote at fb36cc1,
when the record was still a plain dict: labs brought up then must still load.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from lab.core.node import Daemon
from lab.vpn.record import DaemonRecord, TunnelRecord, daemons_of

GOLDEN = Path(__file__).parent / "data" / "labjson_vpn_wireguard-go.json"


def _golden() -> dict:
    return json.loads(GOLDEN.read_text())


def test_a_record_written_before_round_trips_byte_for_byte():
    d = _golden()
    rec = TunnelRecord.from_dict(d)
    assert json.dumps(rec.to_dict(), indent=2) == json.dumps(d, indent=2)  # key order too


def test_fields_are_typed():
    rec = TunnelRecord.from_dict(_golden())
    assert (rec.profile, rec.driver, rec.state, rec.path) == (
        "wireguard",
        "wireguard",
        "up",
        "wireguard-go",
    )
    assert rec.overrides == {"implementation": "wireguard-go"}
    assert rec.interface == "wg0"
    assert rec.traffic.client == "client" and rec.traffic.v4 == "10.99.0.2"
    assert rec.tunnel["server"].v6 == "fd99::2/64" and rec.tunnel["client"].node == "client"
    assert rec.timing.ready_s <= rec.timing.ready_monotonic
    d = rec.daemons[1].daemon()
    assert isinstance(d, Daemon) and d.node == "server" and d.name == "wireguard-go"
    assert d.log == Path("/tmp/s6/h1state/lib/h1gold/logs/server-wireguard-go.log")
    assert DaemonRecord.of(d) == rec.daemons[1]


def test_a_record_cut_short_during_bring_up_and_unknown_keys():
    """A crash between the first save and the tunnel coming up leaves only the early keys;
    a key a later version adds survives this version's load and save."""
    d = {k: v for k, v in _golden().items() if k not in ("describe", "path", "tunnel", "traffic")}
    d.pop("timing")
    d.pop("configs")
    d["state"] = "starting"
    d["future"] = {"x": 1}
    rec = TunnelRecord.from_dict(d)
    assert rec.traffic is None and rec.interface is None and rec.extra == {"future": {"x": 1}}
    assert rec.to_dict() == d


def test_store_and_of_through_lab_info():
    saved = []
    lab = SimpleNamespace(info={}, save=lambda: saved.append(json.dumps(lab.info)))
    assert TunnelRecord.of(lab) is None and daemons_of(lab) == []
    rec = TunnelRecord(profile="p", driver="none", client="a", server="b")
    rec.daemons.append(DaemonRecord("a", "d", 42, 7, None))
    rec.store(lab)
    assert json.loads(saved[-1])["vpn"]["daemons"] == [
        {"node": "a", "name": "d", "pid": 42, "start_time": 7, "log": None}
    ]
    assert TunnelRecord.of(lab) == rec and daemons_of(lab) == rec.daemons
