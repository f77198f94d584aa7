"""Measurement tests: one module per test behind one small interface (lab.measure.base.Test).

test = get_test("tcp", source="plans/a.toml")
params = test.validate({"duration_s": 60}, source="plans/a.toml: tests[0]")
records = test.run(Context(client, server, "10.0.0.2", raw_dir), params)
"""

from __future__ import annotations

from ..errors import ConfigError
from .base import Context, Param, Record, Test
from .contention import ContentionTest
from .mtu import MtuTest
from .ping import PingTest
from .rr import RrTest
from .scp import ScpTest
from .tcp import TcpTest
from .udp import UdpSweepTest, UdpTest

TESTS: dict[str, Test] = {
    t.name: t
    for t in (
        TcpTest(),
        UdpTest(),
        UdpSweepTest(),
        PingTest(),
        ScpTest(),
        MtuTest(),
        RrTest(),
        ContentionTest(),
    )
}


def get_test(name: str, *, source: str | None = None, field: str | None = "test") -> Test:
    """The registered test called `name`; ConfigError listing the valid names otherwise."""
    try:
        return TESTS[name]
    except (KeyError, TypeError):
        raise ConfigError(
            f"unknown test {name!r}; accepted: {', '.join(sorted(TESTS))}",
            source=source,
            field=field,
        ) from None


__all__ = ["TESTS", "Context", "Param", "Record", "Test", "get_test"]
