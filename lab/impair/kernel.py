"""The kernel backend: Impairment -> `tc ... netem` argument lists, and `tc -j qdisc show` back.

Argument builders are pure (unit-tested without root); the few functions that run commands take
a Node and go through `Node.run` (lab/core/proc.py underneath). Decisions about existing state are
made on `tc -j` output, never on the English text of an error.

Rate limiting uses netem's own `rate` (one qdisc, and serialisation delay after the packet's
delay, as docs/impairment-spec.md describes) rather than a child tbf.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from lab.core.errors import ConfigError, PreconditionError
from lab.core.node import Node
from lab.model.impairment.loss import GELoss, RandomLoss, StateLoss
from lab.model.impairment.model import Impairment

#: iproute2 learned `netem seed` in 6.6 (commit a67cf9a2); older tc rejects the word.
SEED_MIN_TC = (6, 6, 0)
#: handle of the ingress qdisc used for ifb redirection (tc convention)
INGRESS_HANDLE = "ffff:"
#: classifiers that can redirect every packet; u32 is built into every kernel we met, matchall
#: is simpler but missing on some (CONFIG_NET_CLS_MATCHALL unset on the CI host)
CLASSIFIERS = ("u32", "matchall")


def _where(parent: str) -> list[str]:
    return ["root"] if parent == "root" else ["parent", parent]


def netem_argv(
    ifname: str,
    imp: Impairment,
    *,
    parent: str = "root",
    handle: str | None = None,
    verb: str = "replace",
    tc_version: tuple[int, int, int] | None = None,
) -> list[str]:
    """`tc qdisc replace dev IF root [handle H] netem WORDS`.

    `replace` creates or swaps the qdisc in one step, so re-applying is idempotent. An empty
    Impairment yields a pass-through netem (no options); callers normally use clear_argv then.
    With `tc_version` known, refuse words that tc version cannot parse.
    """
    if verb not in ("add", "replace", "change"):
        raise ValueError(f"verb must be add, replace or change, got {verb!r}")
    refuse_engine_only(imp)
    if imp.seed is not None and tc_version is not None and tc_version < SEED_MIN_TC:
        raise PreconditionError(
            f"netem seed needs iproute2 >= {'.'.join(map(str, SEED_MIN_TC))}, this tc is "
            f"{'.'.join(map(str, tc_version))}; drop 'seed' from the impairment"
        )
    argv = ["tc", "qdisc", verb, "dev", ifname, *_where(parent)]
    if handle:
        argv += ["handle", handle]
    return argv + ["netem", *imp.to_netem_words()]


def refuse_engine_only(imp: Impairment) -> None:
    """Refuse what only the lab's engine does (a trace-driven link) before any tc runs."""
    if imp.trace is not None:
        raise ConfigError(
            f"trace {imp.trace.path}: kernel netem has no trace-driven link, only the lab's "
            "engine does; build the lab with `--impair-backend userspace` (a lab whose first "
            "--impair has a trace gets the engine by itself)",
            source="impairment",
            field="trace",
        )


def clear_argv(ifname: str, *, parent: str = "root") -> list[str]:
    """`tc qdisc del dev IF root`: back to the device's default qdisc."""
    return ["tc", "qdisc", "del", "dev", ifname, *_where(parent)]


def ifb_create_argvs(ifb: str) -> list[list[str]]:
    """Create and bring up the ifb device ingress traffic is redirected to (record it first)."""
    return [["ip", "link", "add", ifb, "type", "ifb"], ["ip", "link", "set", ifb, "up"]]


def ifb_ingress_argvs(ifname: str, ifb: str, *, classifier: str = "u32") -> list[list[str]]:
    """Redirect everything arriving on IF to IFB's egress, where netem can act on it.

    Then apply `netem_argv(ifb, imp)`. Both devices must be in the same namespace.
    """
    if classifier not in CLASSIFIERS:
        raise ValueError(f"classifier must be one of {', '.join(CLASSIFIERS)}, got {classifier!r}")
    match = ["matchall"] if classifier == "matchall" else ["u32", "match", "u32", "0", "0"]
    return [
        ["tc", "qdisc", "add", "dev", ifname, "handle", INGRESS_HANDLE, "ingress"],
        [
            "tc", "filter", "add", "dev", ifname, "parent", INGRESS_HANDLE,
            "protocol", "all", "prio", "1", *match,
            "action", "mirred", "egress", "redirect", "dev", ifb,
        ],
    ]  # fmt: skip


def ifb_remove_argvs(ifname: str, ifb: str) -> list[list[str]]:
    """Undo ifb_ingress_argvs and ifb_create_argvs (deleting the ingress qdisc drops its filter;
    deleting the ifb drops its netem)."""
    return [
        ["tc", "qdisc", "del", "dev", ifname, "handle", INGRESS_HANDLE, "ingress"],
        ["ip", "link", "del", ifb],
    ]


def show_argv(ifname: str | None = None) -> list[str]:
    return ["tc", "-j", "qdisc", "show", *(["dev", ifname] if ifname else [])]


# --------------------------------------------------------------------------------------------
# Reading back what is really applied
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NetemQdisc:
    """One netem qdisc of `tc -j qdisc show`, as an Impairment plus what it cannot express."""

    dev: str | None
    handle: str
    parent: str  # "root" or the parent class id
    impairment: Impairment
    #: applied settings the Impairment has no field for (slot, ecn, cell size, ...)
    extra: dict[str, Any]


def _pct(frac: Any) -> float:
    # iproute2 prints percentages in JSON as fractions of 1 with %g (q_netem.c print_percent);
    # the kernel keeps them as u32 fractions of 2^32-1, so round away the quantisation.
    return round(float(frac) * 100, 6)


def _us(seconds: Any) -> int:
    return round(float(seconds) * 1_000_000)  # JSON times are seconds (%g)


def netem_from_options(opts: dict[str, Any]) -> tuple[Impairment, dict[str, Any]]:
    """The `options` object of a netem qdisc (q_netem.c netem_print_opt) -> Impairment, extra.

    The delay distribution is not reported by the kernel, so it is always absent here.
    """
    f: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    if "limit" in opts:
        f["limit"] = int(opts["limit"])
    if d := opts.get("delay"):
        f["delay_us"] = _us(d.get("delay", 0))
        f["jitter_us"] = _us(d.get("jitter", 0))
        f["delay_corr_pct"] = _pct(d.get("correlation", 0))
    if lr := opts.get("loss-random"):
        f["loss"] = RandomLoss(_pct(lr["loss"]), _pct(lr.get("correlation", 0)))
    if ls := opts.get("loss-state"):
        f["loss"] = StateLoss(**{p: _pct(ls[p]) for p in StateLoss.PARAMS})
    if lg := opts.get("loss-gemodel"):
        f["loss"] = GELoss(_pct(lg["p"]), _pct(lg["r"]), _pct(lg["1-h"]), _pct(lg["1-k"]))
    for kw in ("duplicate", "reorder", "corrupt"):
        if o := opts.get(kw):
            f[f"{kw}_pct"] = _pct(o[kw])
            f[f"{kw}_corr_pct"] = _pct(o.get("correlation", 0))
    if r := opts.get("rate"):
        f["rate_bps"] = int(r["rate"]) * 8  # JSON rate is bytes/s
        f["rate_packet_overhead"] = int(r.get("packetoverhead", 0))
        for k in ("cellsize", "celloverhead"):
            if r.get(k):
                extra[k] = r[k]
    if "seed" in opts:
        f["seed"] = int(opts["seed"])
    if opts.get("ecn"):
        extra["ecn"] = True
    if opts.get("slot"):
        extra["slot"] = opts["slot"]
    gap = int(opts.get("gap", 0))
    if gap > 1 and "reorder_pct" in f:
        f["reorder_gap"] = gap
    elif gap > 1:
        extra["gap"] = gap  # gap without reorder: kernel state tc would refuse to create
    if "reorder_pct" in f and not f.get("delay_us"):
        extra["reorder_without_delay"] = True  # possible via netlink, not via tc
        f.pop("reorder_pct")
        f.pop("reorder_corr_pct", None)
        f.pop("reorder_gap", None)
    return Impairment(**f), extra


def parse_tc_qdisc_show(text: str) -> list[NetemQdisc]:
    """Every netem qdisc in `tc -j qdisc show [dev IF]` output."""
    data = json.loads(text) if text.strip() else []
    if not isinstance(data, list):
        raise TypeError("tc -j qdisc show output must be a JSON list")
    out = []
    for q in data:
        if q.get("kind") != "netem":
            continue
        parent = "root" if q.get("root") else str(q.get("parent", "?"))
        imp, extra = netem_from_options(q.get("options") or {})
        out.append(NetemQdisc(q.get("dev"), str(q.get("handle", "")), parent, imp, extra))
    return out


def parse_tc_qdisc_show_json(
    text: str, *, dev: str | None = None, parent: str = "root"
) -> Impairment | None:
    """The netem Impairment applied at `parent` (root by default), None if there is none.

    Output of `tc -j qdisc show dev IF` carries no dev names; for output covering several
    devices, pass `dev`.
    """
    found = [
        q
        for q in parse_tc_qdisc_show(text)
        if q.parent == parent and (dev is None or q.dev in (None, dev))
    ]
    if len(found) > 1:
        raise ValueError(
            f"{len(found)} netem qdiscs at {parent} ({', '.join(str(q.dev) for q in found)}); "
            "pass dev="
        )
    return found[0].impairment if found else None


def differences(requested: Impairment, applied: Impairment | None) -> list[str]:
    """What differs between the requested and the really applied impairment, in words.

    Ignores what tc cannot report (the delay distribution) and a seed the kernel picked when
    none was requested. Empty means "applied as requested".
    """
    if applied is None:
        return [] if requested.is_empty() else ["no netem qdisc is applied"]
    want, got = requested.to_json(), applied.to_json()
    if want:
        want.setdefault("limit", 1000)  # what tc puts in force without a limit (netem's default)
    want.pop("distribution", None)
    got.pop("distribution", None)
    if "seed" not in want:
        got.pop("seed", None)
    out = []
    for key in sorted(set(want) | set(got)):
        a, b = want.get(key), got.get(key)
        if key in ("delay_us", "jitter_us") and a and b and abs(a - b) <= 1e-5 * max(a, b) + 1:
            continue  # tc prints times in seconds with %g: 6 significant digits
        if a != b:
            out.append(f"{key}: requested {a!r}, applied {b!r}")
    return out


# --------------------------------------------------------------------------------------------
# Probing
# --------------------------------------------------------------------------------------------


class Probe(NamedTuple):
    ok: bool
    reason: str


def probe_netem(node: Node, *, ifname: str = "lo") -> Probe:
    """Can this node's kernel run netem? Tries a netem root qdisc on `ifname` and removes it.

    Only touches an interface whose root qdisc is the default (noqueue for lo), so an existing
    configuration is never replaced; a netem already there answers the question by itself.
    """
    cp = node.run(show_argv(ifname), check=False)
    if cp.returncode != 0:
        return Probe(False, f"tc -j qdisc show dev {ifname} failed: {_tail(cp.stderr)}")
    roots = [q for q in json.loads(cp.stdout or "[]") if q.get("root")]
    kinds = {q.get("kind") for q in roots}
    if "netem" in kinds:
        return Probe(True, f"a netem qdisc is already the root qdisc of {ifname}")
    if kinds - {"noqueue", "pfifo_fast", "mq", None}:
        return Probe(False, f"{ifname} has root qdisc {', '.join(map(str, kinds))}; not probing")
    cp = node.run(["tc", "qdisc", "add", "dev", ifname, "root", "netem"], check=False)
    if cp.returncode != 0:
        return Probe(
            False, f"kernel refused a netem qdisc (sch_netem missing?): {_tail(cp.stderr)}"
        )
    node.run(clear_argv(ifname), check=False)
    return Probe(True, f"netem qdisc added to and removed from {ifname}")


def tc_version(node: Node) -> tuple[int, int, int] | None:
    """iproute2 version of the node's tc (`tc -V`), None if it cannot be read."""
    cp = node.run(["tc", "-V"], check=False)
    return parse_tc_version(cp.stdout + cp.stderr)


def parse_tc_version(text: str) -> tuple[int, int, int] | None:
    """'tc utility, iproute2-6.1.0, libbpf 1.1.2' -> (6, 1, 0); old 'iproute2-ss190107' -> None."""
    m = re.search(r"iproute2-(?:v)?(\d+)\.(\d+)(?:\.(\d+))?", text)
    return (int(m[1]), int(m[2]), int(m[3] or 0)) if m else None


def _tail(text: str, lines: int = 3) -> str:
    return " ".join((text or "").strip().splitlines()[-lines:]) or "no error text"


def apply_argvs(
    ifname: str, imp: Impairment, *, placement: str = "egress", ifb: str | None = None
) -> list[list[str]]:
    """All commands that put `imp` on IF for a placement: egress or ingress (via `ifb`)."""
    if placement == "egress":
        return [netem_argv(ifname, imp)]
    if placement == "ingress":
        if not ifb:
            raise ValueError("ingress placement needs the ifb device name")
        return [*ifb_create_argvs(ifb), *ifb_ingress_argvs(ifname, ifb), netem_argv(ifb, imp)]
    raise ValueError(f"placement must be egress or ingress here, got {placement!r}")
