"""Measurement tests: one module per test behind one small interface (lab.measure.base.Test).

test = get_test("tcp", source="plans/a.toml")
params = test.validate({"duration_s": 60}, source="plans/a.toml: tests[0]")
records = test.run(Context(client, server, "10.0.0.2", raw_dir), params)

Every module of this package is imported here; each Test subclass in them that sets `name` is
registered (Test.__init_subclass__), so a new test kind is one new file (docs/measurements.md,
"Adding a test kind").
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterable
from dataclasses import dataclass, replace

from lab.core.tools import Tool
from lab.measure.base import REGISTRY, TESTS, Context, Metric, Primary, Record, Test, get_test
from lab.model.params import Param


def _discover() -> dict[str, Test]:
    for mod in pkgutil.iter_modules(__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")
    tests = TESTS  # filled in place: lab.measure.base.get_test reads the same dict
    for name, cls in REGISTRY.items():
        if inspect.isabstract(cls):
            continue
        cls.check_declarations()
        tests[name] = cls()
    return tests


_discover()


def declared_tools() -> list[Tool]:
    """Every tool the tests declare (Test.requires), once each, in registry order."""
    out: dict[str, Tool] = {}
    for t in TESTS.values():
        for tool in t.requires:
            out.setdefault(tool.name, tool)
    return list(out.values())


@dataclass(frozen=True)
class MetricColumn:
    """A results.csv column as the tests declaring it agree on it."""

    name: str
    dtype: str
    unit: str
    summarised: bool
    #: (test, its description) of every declaring test, in registry order
    declared: tuple[tuple[str, str], ...]

    @property
    def tests(self) -> tuple[str, ...]:
        return tuple(t for t, _ in self.declared)

    @property
    def meaning(self) -> str:
        """Tests grouped by description: "tcp, udp: receiver rate; scp: size x 8 / seconds (bit/s)"."""
        by_text: dict[str, list[str]] = {}
        for test, text in self.declared:
            by_text.setdefault(text, []).append(test)
        unit = f" ({self.unit})" if self.unit else ""
        return "; ".join(f"{', '.join(ts)}: {text}" for text, ts in by_text.items()) + unit


def metric_columns(tests: Iterable[Test] | None = None) -> dict[str, MetricColumn]:
    """Every metric column the tests declare, in registry then declaration order.

    TypeError when two tests declare one column with a different dtype, unit or `summarised`.
    """
    out: dict[str, MetricColumn] = {}
    for t in TESTS.values() if tests is None else tests:
        for m in t.metrics:
            col = out.get(m.name)
            if col is None:
                out[m.name] = MetricColumn(
                    m.name, m.dtype, m.unit, m.summarised, ((t.name, m.description),)
                )
                continue
            mine = (m.dtype, m.unit, m.summarised)
            if mine != (col.dtype, col.unit, col.summarised):
                raise TypeError(
                    f"metric column {m.name!r}: test {t.name!r} declares (dtype, unit, "
                    f"summarised) = {mine}, test {col.tests[0]!r} "
                    f"{(col.dtype, col.unit, col.summarised)}"
                )
            if t.name not in col.tests:
                out[m.name] = replace(col, declared=(*col.declared, (t.name, m.description)))
    return out


__all__ = [
    "TESTS",
    "Context",
    "Metric",
    "MetricColumn",
    "Param",
    "Primary",
    "Record",
    "Test",
    "declared_tools",
    "get_test",
    "metric_columns",
]
