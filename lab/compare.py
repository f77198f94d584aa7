"""Two runs side by side: per case and metric, both means and the ratio B/A, as CSV, Markdown and
a plot. Typical use: the same plan emulated here (A) and run on the real boards or imported from a
published table (B); the fidelity section (lab.fidelity) says how well A predicts B.
"""

from __future__ import annotations

from pathlib import Path

from . import fidelity
from .plots import _plt, _save
from .reportdoc import Doc, _fmt, primary
from .results import RunDir, rows, summarize, to_csv
from .state import write_text_atomic

KEY = ("profile", "impairment", "test_label", "point", "metric")
COLUMNS = [
    *KEY,
    "test",
    "n_a",
    "mean_a",
    "sd_a",
    "n_b",
    "mean_b",
    "sd_b",
    "ratio_b_over_a",
]


def _summary(run: RunDir) -> dict[tuple, dict]:
    return {tuple(s[k] for k in KEY): s for s in summarize(rows(run.name, run.load_results()))}


def compare(a: Path, b: Path, out: Path | None = None) -> dict:
    ra, rb = RunDir(Path(a)).check(), RunDir(Path(b)).check()
    out = Path(out) if out is not None else rb.path / f"compare-{ra.name}"
    out.mkdir(parents=True, exist_ok=True)
    sa, sb = _summary(ra), _summary(rb)
    table = []
    for key in [*sa, *(k for k in sb if k not in sa)]:
        x, y = sa.get(key), sb.get(key)
        base = x or y
        ratio = y["mean"] / x["mean"] if x and y and x["mean"] else None
        table.append(
            {
                **dict(zip(KEY, key, strict=True)),
                "test": base["test"],
                "n_a": x["n"] if x else 0,
                "mean_a": x["mean"] if x else None,
                "sd_a": x["sd"] if x else None,
                "n_b": y["n"] if y else 0,
                "mean_b": y["mean"] if y else None,
                "sd_b": y["sd"] if y else None,
                "ratio_b_over_a": ratio,
            }
        )
    only_a = [k for k in sa if k not in sb]
    write_text_atomic(out / "compare.csv", to_csv(table, COLUMNS))

    main = [r for r in table if primary(r["test"]).column == r["metric"]]
    doc = Doc(f"{rb.name} (B) compared with {ra.name} (A)")
    doc.p("Main metric of every case: mean of the successful repetitions in each run and the "
          "ratio B/A. Every metric is in `compare.csv`.")  # fmt: skip
    doc.table(
        ["profile", "impairment", "test", "point", "metric", "A", "B", "B/A"],
        [
            [r["profile"], r["impairment"], r["test_label"], r["point"], r["metric"],
             _fmt(r["mean_a"]), _fmt(r["mean_b"]),
             f"{r['ratio_b_over_a']:.3f}" if r.get("ratio_b_over_a") is not None else "-"]
            for r in main
        ],
    )  # fmt: skip
    plot = _plot(out, ra.name, rb.name, main)
    if plot:
        doc.img(plot, "A vs B")
    fid = fidelity.analyse(table)
    fidelity.write(out, fid)
    fidelity.section(doc, fid, ra.name, rb.name)
    write_text_atomic(out / "compare.md", doc.markdown())
    write_text_atomic(out / "compare.html", doc.html())
    return {"out": str(out), "rows": len(table), "matched": sum(1 for r in table if r["n_a"]
            and r["n_b"]), "only_a": len(only_a), "only_b": len([k for k in sb if k not in sa]),
            "fidelity": fid["summary"]}  # fmt: skip


def _plot(out: Path, name_a: str, name_b: str, main: list[dict]) -> str | None:
    labels = list(dict.fromkeys(r["test_label"] for r in main if r["n_a"] and r["n_b"]))
    if not labels:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(labels), figsize=(max(6, 4.5 * len(labels)), 4.5),
                             squeeze=False, layout="constrained")  # fmt: skip
    for ax, lb in zip(axes[0], labels, strict=True):
        rs = [r for r in main if r["test_label"] == lb and r["n_a"] and r["n_b"]]
        unit = primary(rs[0]["test"])
        scale = unit[2]
        xs = [f"{r['profile']}\n{r['impairment']}" + (f" #{r['point']}" if r["point"] else "")
              for r in rs]  # fmt: skip
        pos = range(len(rs))
        ax.bar([i - 0.2 for i in pos], [r["mean_a"] * scale for r in rs], 0.4, label=f"A {name_a}")
        ax.bar([i + 0.2 for i in pos], [r["mean_b"] * scale for r in rs], 0.4, label=f"B {name_b}")
        for i, r in zip(pos, rs, strict=True):
            if r["ratio_b_over_a"] is not None:
                top = max(r["mean_a"], r["mean_b"]) * scale
                ax.annotate(f"{r['ratio_b_over_a']:.2f}x", (i, top), ha="center", va="bottom",
                            fontsize=7)  # fmt: skip
        ax.set_xticks(list(pos), xs, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel(f"{rs[0]['metric']} ({unit[1]})")
        ax.set_title(lb)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    from .results import RunDir as _R

    return _save(fig, _R(out), "compare")
