"""Drawing helpers the plots share: axes that switch to a log scale only when the values span
more than LOG_RANGE, legends of grouped bars, figures of n panels, bars and lines with error bars
(none where n = 1). matplotlib is imported by the caller (lab.results.plots) and passed in."""

from __future__ import annotations


#: a panel switches to a log axis only when its values span more than this factor
LOG_RANGE = 100.0


#: said in every title with error bars: a mean of one value has none
NO_BAR = "none where n = 1"


def drawn_err(err):
    """Error bars as matplotlib draws them: a missing one (None: one value) as NaN, no bar."""
    if err is None:
        return None
    if err and isinstance(err[0], list):
        return [drawn_err(e) for e in err]
    return [float("nan") if e is None else e for e in err]


def style_axis(ax, values: list[float], label: str, axis: str = "y") -> None:
    """A linear axis with plain ticks; a log axis (still plain numbers, labelled as log) only
    when the positive values span more than LOG_RANGE."""
    from matplotlib.ticker import FuncFormatter  # matplotlib loads with the first plot only

    pos = [v for v in values if v is not None and v > 0]
    log = bool(pos) and max(pos) / min(pos) > LOG_RANGE
    set_scale = ax.set_yscale if axis == "y" else ax.set_xscale
    set_label = ax.set_ylabel if axis == "y" else ax.set_xlabel
    target = ax.yaxis if axis == "y" else ax.xaxis
    if log:
        set_scale("log")
        target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        target.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        set_label(f"{label}, log scale")
    else:
        set_label(label)
        if axis == "y":
            ax.set_ylim(bottom=0)


def condition_legend(ax, conditions: list[str], slots: int, width: float) -> None:
    """The legend of a grouped bar chart (condition j drawn in colour Cj), from patches so a
    condition without any bar still shows its colour; the x range covers every slot, so a
    marker at the last one stays inside."""
    from matplotlib.patches import Patch  # matplotlib loads with the first plot only

    handles = [Patch(color=f"C{j % 10}", label=c) for j, c in enumerate(conditions)]
    ax.legend(handles=handles, fontsize=7, title="condition", title_fontsize=7)
    ax.set_xlim(-width, slots - 1 + width * len(conditions))


def figure(plt, n: int, width: float = 4.8, height: float = 3.8):
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(max(6, width * cols), height * rows),
        squeeze=False,
        layout="constrained",
    )
    flat = [a for row in axes for a in row]
    for a in flat[n:]:
        a.set_visible(False)
    return fig, flat[:n]


def bars(plt, data: dict):
    fig, axes = figure(plt, len(data["panels"]))
    for ax, (title, panel) in zip(axes, data["panels"].items(), strict=True):
        order = [x for s in panel.values() for x in [*s["x"], *s.get("failed", [])]]
        xs = sorted(set(order), key=order.index)
        width = 0.8 / max(1, len(panel))
        for j, (name, s) in enumerate(panel.items()):
            pos = [xs.index(x) + j * width for x in s["x"]]
            color = f"C{j % 10}"
            ax.bar(pos, s["y"], width, yerr=drawn_err(s.get("err")), capsize=3, label=name,
                   color=color)  # fmt: skip
            for x in s.get("failed", []):
                ax.text(xs.index(x) + j * width, 0.02, "all failed", rotation=90, ha="center",
                        va="bottom", fontsize=7, color=color,
                        transform=ax.get_xaxis_transform())  # fmt: skip
        ax.set_xticks(
            [i + width * (len(panel) - 1) / 2 for i in range(len(xs))],
            xs,
            rotation=30,
            ha="right",
        )
        style_axis(ax, [y for s in panel.values() for y in s["y"]], data["ylabel"])
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
        condition_legend(ax, list(panel), len(xs), width)
    fig.suptitle(data["title"])
    return fig


#: line styles of a profile's repetitions 0, 1, 2, ... (its colour stays the same)
LINE_STYLES = ("-", "--", ":", "-.")


def _colour_key(name: str, s: dict) -> str:
    """Which lines share a colour: a profile's ("PROFILE #REP": its repetitions), or the line's
    whose colour a series names (`colour_of`: rrul's underlay ping beside the tunnel's)."""
    return s.get("colour_of") or name.split(" #")[0]


def lines(plt, data: dict, *, errors: bool = True, marker: str | None = "o", step=False, x0=None):
    """Panels of lines; a series may set its `linestyle` and take another line's colour
    (`colour_of`, that line's name)."""
    fig, axes = figure(plt, len(data["panels"]))
    # one colour per profile in every panel; its repetitions ("PROFILE #REP") differ by line style
    keys = list(
        dict.fromkeys(_colour_key(n, s) for p in data["panels"].values() for n, s in p.items())
    )
    for ax, (title, panel) in zip(axes, data["panels"].items(), strict=True):
        for name, s in panel.items():
            rep = name.partition(" #")[2]
            style = {
                "label": name,
                "color": f"C{keys.index(_colour_key(name, s)) % 10}",
                "linestyle": s.get("linestyle")
                or (LINE_STYLES[int(rep) % len(LINE_STYLES)] if rep.isdigit() else "-"),
            }
            if step:
                ax.step(s["x"], s["y"], where="post", **style)
            elif errors and s.get("err"):
                ax.errorbar(
                    s["x"], s["y"], yerr=drawn_err(s["err"]), marker=marker, capsize=3, **style
                )
            else:
                ax.plot(s["x"], s["y"], marker=marker, **style)
        if step:
            ax.set_ylabel(data["ylabel"])
            ax.set_ylim(0, 1.02)
            style_axis(ax, [x for s in panel.values() for x in s["x"]], data["xlabel"], "x")
        else:
            ax.set_xlabel(data["xlabel"])
            ys = [y for s in panel.values() for y in s["y"]]
            style_axis(ax, ys, data["ylabel"])
            if ys and ax.get_yscale() == "linear" and max(ys) > 0:
                ax.set_ylim(top=1.12 * max(ys))  # a line at the maximum stays in sight
            if x0 is not None:
                ax.set_xlim(left=x0)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, ncol=2 if len(panel) > 6 else 1)
    fig.suptitle(data["title"])
    return fig
