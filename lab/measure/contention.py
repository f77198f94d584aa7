"""contention: run another test while a CPU-bound process competes for a node's CPU.

Study C's repeat "with a CPU-bound background process": crypto and the benchmark share the CPU.
The hog is a Python busy loop (present wherever the lab runs), optionally pinned with taskset;
`workers` of them start before the wrapped test and are stopped in finally.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from lab.core.errors import ConfigError
from lab.measure.base import TESTS, Context, Primary, Record, Test, get_test
from lab.model.params import Param

HOG = ["python3", "-c", "while True: pass"]


def hog_argv(cpu: int | None) -> list[str]:
    return (["taskset", "-c", str(cpu)] if cpu is not None else []) + HOG


class ContentionTest(Test):
    name = "contention"
    plots = ("throughput",)
    schema: ClassVar[dict[str, Param]] = {
        "test": Param(str, None, doc="name of the wrapped test"),
        "params": Param(dict, {}, doc="the wrapped test's parameters"),
        "node": Param(str, "server", choices=("client", "server")),
        "workers": Param(int, 1, min=1, max=64, doc="busy loops started"),
        "cpu": Param(int, None, optional=True, min=0, max=4095, doc="pin the loops (taskset -c)"),
    }
    #: no columns of its own: its records are the wrapped test's, filled by that test's metrics
    metrics = ()
    primary = Primary("throughput_bps", "Mbit/s", 1e-6, True)

    def estimate_s(self, params: Mapping[str, Any]) -> float:
        inner = get_test(params["test"])
        return inner.estimate_s(inner.validate(params["params"], source="estimate")) + 0.5

    def needs(self, params: Mapping[str, Any]) -> tuple[str, ...]:
        return get_test(params["test"]).needs(params["params"])

    def validate(self, params: Mapping[str, Any] | None, *, source: str) -> dict[str, Any]:
        out = super().validate(params, source=source)
        if out["test"] == self.name:
            valid = ", ".join(n for n in sorted(TESTS) if n != self.name)
            raise ConfigError(f"cannot wrap itself; accepted: {valid}", source=source, field="test")
        inner = get_test(out["test"], source=source, field="test")
        out["params"] = inner.validate(out["params"], source=f"{source}: params")
        return out

    def digest_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        inner = get_test(params["test"]).digest_params(params["params"])
        return {**super().digest_params(params), "params": inner}

    def run(self, ctx: Context, params: Mapping[str, Any]) -> list[Record]:
        inner = get_test(params["test"])
        node = ctx.client if params["node"] == "client" else ctx.server
        hogs = []
        try:
            for i in range(params["workers"]):
                hogs.append(node.spawn(f"cpu-hog-{i}", hog_argv(params["cpu"])))
            records = inner.run(ctx, params["params"])
            alive = all(h.alive() for h in hogs)
        finally:
            for h in hogs:
                node.stop(h)
        for r in records:
            r["contention"] = {
                "node": params["node"],
                "node_name": node.name,
                "workers": params["workers"],
                "cpu": params["cpu"],
                "hog": " ".join(hog_argv(params["cpu"])),
                "alive_throughout": alive,
            }
            if not alive and r["ok"]:
                r["ok"] = False
                r["error"] = "CPU hog died during the test; the point was not under contention"
        return records
