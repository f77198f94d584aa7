"""The test registry: a test kind is one module in lab/measure declaring its name, schema, metrics,
primary metric and time estimate; discovery registers it and results.csv, the report and the
plan's ETA take it from there (no root)."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import textwrap
from typing import ClassVar

import pytest

from lab.core.errors import ConfigError
from lab.measure import TESTS, Metric, Param, Primary, Test, get_test, metric_columns
from lab.measure.base import PLOTS, RANKS, REGISTRY
from lab.campaign.plan import estimate_s
from lab.results.doc import DEFAULT_PRIMARY, primary
from lab.results.columns import COLUMN_NAMES

from .conftest import REPO

MEASURE = REPO / "lab" / "measure"


def _named_test_classes() -> dict[str, str]:
    """name -> class, for every class in lab/measure/*.py that assigns `name = "..."`."""
    out = {}
    for path in sorted(MEASURE.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef):
                continue
            for stmt in node.body:
                if (
                    isinstance(stmt, ast.Assign)
                    and [getattr(t, "id", None) for t in stmt.targets] == ["name"]
                    and isinstance(stmt.value, ast.Constant)
                ):
                    out[stmt.value.value] = node.name
    return out


def test_every_named_test_class_in_the_package_is_registered():
    classes = _named_test_classes()
    assert {"tcp", "udp", "udp-sweep", "ping", "scp", "mtu", "rr", "contention"} <= set(classes)
    assert {n: type(t).__name__ for n, t in TESTS.items()} == classes


def test_unknown_test_error_is_unchanged():
    with pytest.raises(ConfigError) as e:
        get_test("iperf", source="plans/x.toml")
    assert str(e.value) == (
        f"plans/x.toml: test: unknown test 'iperf'; accepted: {', '.join(sorted(TESTS))}"
    )


def _defaults(name: str) -> dict:
    args = {"test": "ping", "params": {"count": 3}} if name == "contention" else {}
    return TESTS[name].validate(args, source="t")


@pytest.mark.parametrize("name", sorted(TESTS))
def test_each_test_declares_metrics_primary_and_estimate(name):
    t = TESTS[name]
    assert isinstance(t.primary, Primary) and t.primary.column in COLUMN_NAMES
    assert primary(name) == t.primary
    assert all(m.name in COLUMN_NAMES for m in t.metrics)
    assert estimate_s(name, _defaults(name)) > 0


def test_estimates_are_the_tests_own():
    tcp = TESTS["tcp"].validate({"duration_s": 10, "omit_s": 2}, source="t")
    assert estimate_s("tcp", tcp) == 12.5
    assert estimate_s("udp-sweep", _defaults("udp-sweep")) == pytest.approx(16 * 10.3 + 0.5)
    assert estimate_s("ping", _defaults("ping")) == pytest.approx(500 * 0.2 + 0.3)
    assert estimate_s("mtu", TESTS["mtu"].validate({"addr6": "2001:2::2"}, source="t")) == 3.0
    assert estimate_s("scp", _defaults("scp")) == pytest.approx(1 + 256 * 8 / 100)
    inner = estimate_s("ping", TESTS["ping"].validate({"count": 3}, source="t"))
    assert estimate_s("contention", _defaults("contention")) == pytest.approx(inner + 0.5)
    assert primary("no-such-test") == DEFAULT_PRIMARY


def _fake(module: str, name: str, **attrs) -> type[Test]:
    body = {
        "__module__": module,
        "name": name,
        "__qualname__": f"Fake_{name.replace('-', '_')}",
        "schema": {"x": Param(int, 0)},
        "primary": Primary("seconds", "s"),
        "run": lambda self, ctx, params: [],
        **attrs,
    }
    return type(body["__qualname__"], (Test,), body)


def test_a_name_taken_in_the_package_is_refused():
    before = dict(REGISTRY)
    with pytest.raises(TypeError, match="'ping' of lab.measure.dup.Fake_ping is already taken"):
        _fake("lab.measure.dup", "ping")
    assert before == REGISTRY


def test_classes_outside_the_package_are_not_registered():
    _fake("tests.elsewhere", "elsewhere-only")
    assert "elsewhere-only" not in REGISTRY and "elsewhere-only" not in TESTS


@pytest.mark.parametrize(
    "attrs, message",
    [
        ({"metrics": (Metric("n", "int64"),)}, "dtype 'int64'; accepted: float64, string"),
        ({"metrics": (Metric("n"), Metric("n"))}, "metric 'n' declared twice"),
        ({"metrics": ("n",)}, "metrics must be Metric"),
        ({"primary": None}, "primary must be a Primary"),
        ({"primary": ("seconds", "s", 1.0, True)}, "primary must be a Primary"),
        ({"name_": ""}, "name must be a non-empty string"),
        ({"plots": ("bars",)}, "plots must be a tuple of throughput, "),
        ({"plots": "throughput"}, "plots must be a tuple of"),
        ({"ranks": "loss"}, "ranks must be None or one of throughput, rtt"),
        ({"client_tools": ("iperf3",)}, r"tools \['iperf3'\] are not declared in requires"),
        ({"requires": ("iperf3",)}, "requires must be Tool"),
    ],
)
def test_malformed_declarations_are_named(attrs, message):
    name = attrs.pop("name_", "malformed")
    cls = _fake("tests.elsewhere", name, **attrs)
    with pytest.raises(TypeError, match=message):
        cls.check_declarations()


def test_one_column_two_tests_must_agree():
    a = _fake("tests.elsewhere", "a", metrics=(Metric("lat", unit="ms", description="x"),))()
    b = _fake("tests.elsewhere", "b", metrics=(Metric("lat", unit="us", description="y"),))()
    with pytest.raises(TypeError, match="metric column 'lat': test 'b' declares"):
        metric_columns([a, b])
    c = _fake("tests.elsewhere", "c", metrics=(Metric("lat", unit="ms", description="z"),))()
    col = metric_columns([a, c])["lat"]
    assert col.tests == ("a", "c") and col.meaning == "a: x; c: z (ms)"


PROBE = '''
"""A test kind that exists only in this copy of the package."""
from typing import ClassVar

from .base import Metric, Param, Primary, Test


class ProbeTest(Test):
    name = "probe"
    schema: ClassVar[dict[str, Param]] = {"widgets": Param(int, 3, min=1)}
    metrics = (
        Metric("probe_widgets", unit="widgets", description="widgets seen"),
        Metric("loss_pct", unit="%", description="lost widgets"),
    )
    primary = Primary("probe_widgets", "widgets", 1.0, False)

    def estimate_s(self, params):
        return 2.0 * params["widgets"]

    def run(self, ctx, params):
        return [self.record(widgets_seen=params["widgets"])]
'''

CHECK = """
import json
from lab.measure import TESTS, get_test
from lab.campaign.plan import estimate_s
from lab.results.doc import primary
from lab.results.columns import COLUMN_NAMES, CSV_COLUMNS, SUMMARY_METRICS
from lab.results.rundir import rows
from lab.core.errors import ConfigError

try:
    get_test("nope")
except ConfigError as e:
    msg = str(e)
line = {"case": "p|none|probe|0", "profile": "p", "test": "probe", "label": "probe", "rep": 0,
        "ok": True, "records": [{"test": "probe", "ok": True, "probe_widgets": 4, "loss_pct": 0}]}
print(json.dumps({
    "tests": sorted(TESTS),
    "last": CSV_COLUMNS[-1],
    "loss": [c for c in CSV_COLUMNS if c[0] == "loss_pct"][0],
    "n": len(COLUMN_NAMES),
    "summarised": "probe_widgets" in SUMMARY_METRICS,
    "primary": list(primary("probe")),
    "estimate": estimate_s("probe", get_test("probe").validate({"widgets": 5}, source="t")),
    "wrapped": get_test("contention").validate({"test": "probe"}, source="t")["params"],
    "msg": msg,
    "row": rows("R", [line])[0]["probe_widgets"],
}))
"""


def test_a_new_module_alone_adds_a_test_kind(tmp_path):
    """A copy of the package plus one file: the test is registered, accepted by plans and
    contention, has its ETA, its primary metric and a results.csv column, with no other edit."""
    shutil.copytree(REPO / "lab", tmp_path / "lab", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "lab" / "measure" / "zz_probe.py").write_text(textwrap.dedent(PROBE))
    cp = subprocess.run([sys.executable, "-c", CHECK], cwd=tmp_path, capture_output=True,
                        text=True, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert cp.returncode == 0, cp.stderr
    got = json.loads(cp.stdout)
    assert got["tests"] == sorted([*TESTS, "probe"])
    assert got["last"] == ["probe_widgets", "float64", "probe: widgets seen (widgets)"]
    assert got["n"] == len(COLUMN_NAMES) + 1  # one new column, appended; loss_pct is shared
    assert got["loss"][2].endswith("; probe: lost widgets (%)")
    assert got["summarised"] and got["row"] == 4.0
    assert got["primary"] == ["probe_widgets", "widgets", 1.0, False]
    assert got["estimate"] == 10.0 and got["wrapped"] == {"widgets": 3}
    assert "accepted: " in got["msg"] and "probe" in got["msg"]


class _Shadow(Test):
    """Defined in a test module with a name: usable (monkeypatched) but never registered."""

    name = "shadow"
    schema: ClassVar[dict[str, Param]] = {}

    def run(self, ctx, params):
        return []


def test_a_test_defined_outside_the_package_stays_out():
    assert "shadow" not in TESTS and "shadow" not in REGISTRY
    assert primary("shadow") == DEFAULT_PRIMARY and _Shadow().estimate_s({}) == 5.0


#: the report modules: what they draw of a test is what it declares (Test.plots, Test.ranks)
REPORT_MODULES = ("report", "preamble", "ranking", "plots", "series", "doc")
#: string constants there that are a test's name for another reason: (module, constant, why)
NOT_A_BRANCH = {
    ("plots", "udp"),  # the file name plots/udp.png that existing reports link
    ("preamble", "mtu"),  # a profile's tunnel MTU in the manifest (Driver.describe)
}


def test_the_report_never_names_a_test():
    """No test name as a string constant in the report's modules: a new test kind is drawn by
    what it declares, and renaming a test changes no report code."""
    found = set()
    for mod in REPORT_MODULES:
        tree = ast.parse((REPO / "lab" / "results" / f"{mod}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in TESTS:
                found.add((mod, node.value))
    assert found - NOT_A_BRANCH == set()


def test_the_report_draws_what_each_test_declares():
    assert {k for t in TESTS.values() for k in t.plots} == set(PLOTS)  # every kind is used
    assert {t.ranks for t in TESTS.values()} - {None} == set(RANKS)
    assert TESTS["tcp"].plots == ("throughput", "throughput-time")
    assert TESTS["ping"].ranks == "rtt" and TESTS["contention"].ranks is None
