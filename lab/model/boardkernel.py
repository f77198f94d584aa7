"""The board's data planes: which code carries a tunnel's packets on the board, on how many of
its cores, and how fast; and the share of this host's CPU a stand-in gets to match it.

On a board, XFRM ESP, MACsec and kernel WireGuard run the board kernel's own crypto code (not
OpenSSL's) with the kernel's threading: one SA is processed on one core at a time (encrypted in
the sending context, decrypted in the NET_RX softirq of the core that takes the NIC's
interrupt), while kernel WireGuard spreads its crypto over every core with per-CPU workers. A
lab without those kernel modules runs a userspace stand-in (charon's kernel-libipsec,
wireguard-go) whose own code and threads differ. A board profile therefore states, per kernel
data plane, its threading and which of its `[reference.kernel-*]` figures carries each stand-in
primitive (`[kernel.dataplane.NAME]`), and the lab holds the stand-in to both: its threads in as
many capped groups as the board's kernel uses cores, each group at

    share = the board's figure for the primitive / this host's masked rate of the stand-in's code

host cores (one board core running the board's code, for the stand-in's code on this host).
A userspace data plane that the board runs too (OpenVPN, tinc, wireguard-go or kernel-libipsec
chosen explicitly) gets the same treatment with the board's userspace figure for its dominant
primitive (e.g. OpenSSL's AES-256-CBC for OpenVPN), so a primitive that one fitted core_share
prices badly on this host's CPU is priced right where it dominates (docs/cpu.md "Data planes").
Where the profile also states the board kernel's own packet path around the AEAD
(`[kernel.dataplane.NAME.path]`: packets per second of one board core, counted by
bench/kernel_dataplane.py), the board's side is that path plus the kernel's AEAD, and the
stand-in's own per-packet work (syscalls, TUN, UDP, hand-offs) no longer stands for it; without
one, the stand-in's path is priced at a board core's speed (docs/cpu.md "Data planes"). A
userspace data plane's own path on the board (`[userspace.dataplane.NAME.path]`, NAME the
process's name: its TUN reads and writes, UDP sends and receives, framing, HMAC, everything but
its cipher, counted by bench/openvpn_dataplane.py) is used the same way.

Pure: parsing and arithmetic; the substrate creates the groups (lab.substrate.local.dataplane).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lab.core.errors import ConfigError, reject_unknown
from lab.model.dpqueue import DataPlaneQueue, parse_queue, queue_record

#: how a board's kernel spreads one tunnel's packet crypto over its cores
THREADING = ("one-core", "per-cpu")
_PATH_FIELDS = ("bytes", "confidence", "derivation", "kernel", "pps", "source")


@dataclass(frozen=True)
class PacketPath:
    """The board kernel's per-packet work around a data plane's AEAD, one side of it (sending
    or receiving), per stand-in primitive: packets per second of one board core."""

    pps: dict[str, float]
    source: str
    bytes: int = 1400  # the datagram it was counted with (the path's cost hardly depends on it)
    kernel: str = ""
    derivation: str = ""
    confidence: str = "low"
    program: str = ""  # a userspace data plane's: the program and version counted


@dataclass(frozen=True)
class UserspaceDataPlane:
    """A userspace data plane the board runs too (OpenVPN): its own per-packet path on the
    board, besides its cipher (which the profile's [reference.PRIMITIVE] prices)."""

    name: str  # the process's name (DataPlaneCpu.daemon), e.g. "openvpn"
    path: PacketPath | None = None


@dataclass(frozen=True)
class KernelDataPlane:
    name: str  # e.g. "xfrm-esp", "wireguard", "macsec"
    threading: str
    source: str
    why: str = ""
    #: the stand-in's primitive on this host -> the profile's reference for the board kernel's code
    crypto: dict[str, str] = field(default_factory=dict)
    path: PacketPath | None = None
    #: packets it holds before it drops, each way (lab.model.dpqueue)
    queue: DataPlaneQueue | None = None


@dataclass(frozen=True)
class BoardKernel:
    version: str = ""
    arch: str = ""
    source: str = ""
    dataplanes: dict[str, KernelDataPlane] = field(default_factory=dict)


@dataclass(frozen=True)
class DataPlaneCpu:
    """What a VPN driver declares about the process that carries its packets on a node."""

    daemon: str  # the name it is spawned under (LocalNode.spawn)
    #: the crypto primitive its packets cost most, as this host runs it (cpuprofile.PRIMITIVES
    #: name); None when it has none (no cipher) or none the lab knows
    primitive: str | None
    #: "kernel:<data plane>" when the board would run the kernel's (the process is a stand-in),
    #: "userspace" when the board runs the same program
    board: str
    #: userspace only: "one" (a single data-path thread, e.g. OpenVPN 2.x) or "program" (the
    #: program's own threads, spread over the board's cores)
    threads: str = "program"
    #: what stands in for what, in words (the record's `stand_in`)
    what: str = ""


@dataclass(frozen=True)
class _DataPlaneSection:
    """What a profile's [NAME] table of data planes accepts: [NAME.dataplane.X] and its path."""

    name: str  # "kernel", "userspace"
    fields: tuple[str, ...]  # of [NAME]
    dataplane_fields: tuple[str, ...]  # of [NAME.dataplane.X]
    path_fields: tuple[str, ...]  # of [NAME.dataplane.X.path]
    #: what a path's primitive lacks when it is not among the figures its pps may name, in words
    figures_what: str


_KERNEL = _DataPlaneSection(
    "kernel",
    ("arch", "dataplane", "source", "version"),
    ("crypto", "path", "queue", "source", "threading", "why"),
    _PATH_FIELDS,
    "no board AEAD in the crypto table",
)
#: a userspace path also names the program (and version) it was counted with
_USERSPACE = _DataPlaneSection(
    "userspace",
    ("dataplane",),
    ("path",),
    tuple(sorted((*_PATH_FIELDS, "program"))),
    "no [reference.PRIMITIVE] figure in this profile (the board's cipher)",
)


def parse_kernel_table(
    table: Any, src: str, references: dict, primitives: dict
) -> BoardKernel | None:
    """Validate a profile's [kernel] table (errors name the file, the field and what is
    accepted); `references` are the profile's [reference.*] (a crypto entry must name one)."""
    if table is None:
        return None
    dps = _parse_dataplanes(
        table, src, _KERNEL, lambda d, where: _kernel_crypto(d, src, where, references, primitives)
    )
    for k in ("version", "arch", "source"):
        if not isinstance(table.get(k, ""), str):
            raise ConfigError("must be a string", source=src, field=f"kernel.{k}")
    return BoardKernel(
        str(table.get("version", "")),
        str(table.get("arch", "")),
        str(table.get("source", "")),
        {
            name: KernelDataPlane(
                name,
                d["threading"],
                d["source"],
                str(d.get("why", "")),
                figures,
                path,
                parse_queue(d.get("queue"), src, f"kernel.dataplane.{name}", figures),
            )
            for name, (d, figures, path) in dps.items()
        },
    )


def parse_userspace_table(table: Any, src: str, references: dict) -> dict[str, UserspaceDataPlane]:
    """Validate a profile's [userspace] table: [userspace.dataplane.NAME.path] per userspace
    data plane (NAME: its process's name); a path's primitive must have a [reference.PRIMITIVE]
    (the board's figure for the cipher the path leaves out)."""
    if table is None:
        return {}
    dps = _parse_dataplanes(table, src, _USERSPACE, lambda d, where: dict(references))
    return {name: UserspaceDataPlane(str(name), path) for name, (_d, _f, path) in dps.items()}


def _parse_dataplanes(
    table: Any, src: str, section: _DataPlaneSection, figures_of: Callable[[dict, str], dict]
) -> dict[str, tuple[dict, dict, PacketPath | None]]:
    """A profile's [SECTION] table and its [SECTION.dataplane.X] tables, each checked against
    the fields `section` accepts; `figures_of(X's table, "SECTION.dataplane.X")` checks the rest
    of X and returns the figures X's path may name. {X: (its table, those figures, its path)}."""
    if not isinstance(table, dict):
        raise ConfigError(
            f"must be a table; accepted fields: {', '.join(section.fields)}",
            source=src,
            field=section.name,
        )
    reject_unknown(table, section.fields, source=src, where=section.name)
    dps = table.get("dataplane", {})
    if not isinstance(dps, dict):
        raise ConfigError(
            f"must be a table of [{section.name}.dataplane.NAME] tables",
            source=src,
            field=f"{section.name}.dataplane",
        )
    out = {}
    for name, d in dps.items():
        where = f"{section.name}.dataplane.{name}"
        if not isinstance(d, dict):
            raise ConfigError(
                f"must be a table; accepted fields: {', '.join(section.dataplane_fields)}",
                source=src,
                field=where,
            )
        reject_unknown(d, section.dataplane_fields, source=src, where=where)
        figures = figures_of(d, where)
        out[name] = (d, figures, _parse_path(d.get("path"), src, where, figures, section))
    return out


def _kernel_crypto(d: dict, src: str, where: str, references: dict, primitives: dict) -> dict:
    """Check a [kernel.dataplane.X]'s threading, source and crypto table; returns the crypto
    table (stand-in primitive -> the board kernel's reference), what its path may name."""
    if d.get("threading") not in THREADING:
        raise ConfigError(
            f"must be one of {', '.join(THREADING)}, got {d.get('threading')!r}",
            source=src,
            field=f"{where}.threading",
        )
    if not isinstance(d.get("source"), str) or not d["source"]:
        raise ConfigError(
            "missing: say where the threading comes from", source=src, field=f"{where}.source"
        )
    crypto = d.get("crypto", {})
    if not isinstance(crypto, dict):
        raise ConfigError(
            'must be a table of STAND-IN-PRIMITIVE = "kernel-REFERENCE"',
            source=src,
            field=f"{where}.crypto",
        )
    _known(crypto, primitives, "is a primitive the lab does not know", src, f"{where}.crypto")
    for prim, ref in crypto.items():
        if ref not in references:
            raise ConfigError(
                f"names {ref!r}, which has no [reference.{ref}] table in this profile; "
                f"references: {', '.join(references) or 'none'}",
                source=src,
                field=f"{where}.crypto.{prim}",
            )
    return dict(crypto)


def _known(names: dict, accepted: dict, lacks: str, src: str, where: str) -> None:
    """Refuse the first of `names` not among `accepted`, naming it (under `where`), what it
    `lacks` and the accepted names."""
    for name in names:
        if name not in accepted:
            raise ConfigError(
                f"{name!r} {lacks}; accepted: {', '.join(accepted) or 'none'}",
                source=src,
                field=f"{where}.{name}",
            )


def _parse_path(
    t: Any, src: str, where: str, figures: dict, section: _DataPlaneSection
) -> PacketPath | None:
    if t is None:
        return None
    where = f"{where}.path"
    if not isinstance(t, dict):
        raise ConfigError("must be a table with pps and source", source=src, field=where)
    reject_unknown(t, section.path_fields, source=src, where=where)
    if not isinstance(t.get("source"), str) or not t["source"]:
        raise ConfigError(
            "missing: say where the packet path's figures come from",
            source=src,
            field=f"{where}.source",
        )
    pps = t.get("pps")
    if not isinstance(pps, dict) or not pps:
        raise ConfigError(
            "must be a table of STAND-IN-PRIMITIVE = packets per second of one board core",
            source=src,
            field=f"{where}.pps",
        )
    _known(pps, figures, f"has {section.figures_what}", src, f"{where}.pps")
    for prim, v in pps.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ConfigError(
                f"must be a positive number (packets/s), got {v!r}",
                source=src,
                field=f"{where}.pps.{prim}",
            )
    nbytes = t.get("bytes", 1400)
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
        raise ConfigError(
            f"must be a positive integer (bytes), got {nbytes!r}",
            source=src,
            field=f"{where}.bytes",
        )
    for k in ("kernel", "derivation", "confidence", "program"):
        if not isinstance(t.get(k, ""), str):
            raise ConfigError("must be a string", source=src, field=f"{where}.{k}")
    if t.get("confidence", "low") not in ("high", "medium", "low"):
        raise ConfigError(
            f"must be one of high, medium, low, got {t['confidence']!r}",
            source=src,
            field=f"{where}.confidence",
        )
    return PacketPath(
        {k: float(v) for k, v in pps.items()},
        t["source"],
        nbytes,
        t.get("kernel", ""),
        t.get("derivation", ""),
        t.get("confidence", "low"),
        t.get("program", ""),
    )


def share_of(
    core_share: float,
    board_mbps: float | None,
    process_mbps: float | None,
    prim_mbps: float | None,
    path_mbps: float | None = None,
    path_what: str = "board kernel",
) -> tuple[float, dict]:
    """Host cores per board core for a data plane's process, and how it was worked out.

    The process's time per byte here, t = 1/process_mbps (measured as a whole process), is its
    crypto, c = 1/prim_mbps (the primitive alone, measured), plus the rest n = t - c (its packet
    path: reads, sends, copies, hand-offs). On the board the crypto costs 1/board_mbps (the board
    code's figure) and the rest what it costs on a board core: n / core_share. So

        share = t / (1/board_mbps + (t - c) / core_share)

    With `path_mbps`, the board's own packet path (the board kernel's around its AEAD, or a
    userspace data plane's around its cipher: its per-packet cost over the process's datagram;
    `path_what` says which), the board side is known whole, crypto and path, and the process's
    path here no longer stands for it:

        share = t / (1/board_mbps + 1/path_mbps)

    Without a whole-process rate the process is taken as all crypto (share = board / prim);
    without a board figure its crypto is priced like the rest (share = core_share)."""
    if not board_mbps or not prim_mbps:
        return core_share, {"basis": "core_share"}
    c = 1 / prim_mbps
    if not process_mbps:
        return board_mbps / prim_mbps, {"basis": "primitive", "crypto_fraction": 1.0}
    t = max(1 / process_mbps, c)
    how: dict[str, Any] = {"basis": "process", "crypto_fraction": round(c / t, 4)}
    if path_mbps:
        board_t = 1 / board_mbps + 1 / path_mbps
        how["path"] = path_what
        how["board_path_mbps"] = round(path_mbps, 2)
    else:
        board_t = 1 / board_mbps + (t - c) / core_share
        how["path"] = "stand-in at core_share"
    how["board_mbps_predicted"] = round(1 / board_t, 2)
    return t / board_t, how


def plan(prof, dp: DataPlaneCpu, *, cores: int) -> dict:
    """The groups a node running `dp` gets under profile `prof` (a CpuProfile): how many (the
    board's threading), the share of each (host cores) and where every number comes from.
    `cores`: the board cores the node emulates. Returns the record lab.json keeps."""
    cal = (prof.calibration or {}) if prof.calibrated else {}
    host = cal.get("host_mbps") or {}
    # the process as a whole, "DAEMON:PRIMITIVE" (lab/campaign/calibstandin.py)
    process = (cal.get("process_mbps") or {}).get(f"{dp.daemon}:{dp.primitive}")
    rec: dict[str, Any] = {
        "daemon": dp.daemon,
        "stand_in": dp.what,
        "board": dp.board,
        "primitive": dp.primitive,
    }
    ref = None
    path_mbps = None
    path_what = "board kernel"
    if dp.board.startswith("kernel:"):
        kdp = (prof.kernel.dataplanes if prof.kernel else {}).get(dp.board.split(":", 1)[1])
        if kdp is None:
            rec.update(
                threading="program",
                groups=max(1, cores),
                why=f"profile {prof.name} states no [kernel.dataplane.{dp.board[7:]}]: the "
                "stand-in keeps its own threads on the board's cores",
            )
        else:
            rec.update(
                threading=kdp.threading,
                groups=1 if kdp.threading == "one-core" else max(1, cores),
                threading_source=kdp.source,
                kernel=f"{prof.kernel.version} {prof.kernel.arch}".strip(),
            )
            if q := queue_record(kdp.queue, dp.primitive):
                rec["queue"] = q  # the stand-in's socket and TUN hold as many (dpqueue)
            ref_name = kdp.crypto.get(dp.primitive or "")
            ref = prof.references.get(ref_name) if ref_name else None
            if ref is not None:
                path_mbps = _path_mbps(cal, dp, kdp.path, rec)
            if ref is None:
                rec["why"] = (
                    f"profile {prof.name} names no board-kernel figure for {dp.primitive} in "
                    f"[kernel.dataplane.{kdp.name}.crypto]: one board core's share (core_share)"
                )
    else:
        one = dp.threads == "one"
        rec.update(threading="one-thread" if one else "program", groups=1 if one else max(1, cores))
        ref = prof.references.get(dp.primitive or "")
        if ref is None and dp.primitive:
            rec["why"] = f"profile {prof.name} has no figure for {dp.primitive}: core_share"
        udp = prof.userspace.get(dp.daemon)
        if ref is not None and udp is not None:
            path_mbps = _path_mbps(cal, dp, udp.path, rec)
            path_what = "board userspace"
    if ref is not None:
        rec.update(
            board_reference=ref.primitive,
            board_mbps=ref.mbps,
            board_source=ref.source,
            implementation=ref.implementation,
        )
    prim_mbps = host.get(dp.primitive or "")
    share, how = share_of(
        prof.core_share, ref.mbps if ref else None, process, prim_mbps, path_mbps, path_what
    )
    basis = how.pop("basis")
    rec.update(how)
    if prim_mbps:
        rec["host_mbps"] = prim_mbps
    if process:
        rec["process_mbps"] = process
    if ref is not None and basis != "process" and dp.board.startswith("kernel:"):
        # a stand-in priced by its primitive alone would be held far below the board's code
        # (the cipher is 5-15 % of its CPU time): one board core's share instead
        share, basis = prof.core_share, "core_share"
        rec["why"] = (
            f"its stand-in not measured as a process on this machine (`sudo lab calibrate "
            f"{prof.name}`, full): core_share"
        )
    elif ref is not None and not prim_mbps:
        rec["why"] = (
            f"{dp.primitive} not measured on this machine (`sudo lab calibrate {prof.name}`)"
        )
    rec.update(share=round(share, 6), basis=basis, vs_core_share=round(share / prof.core_share, 3))
    return rec


def _path_mbps(cal: dict, dp: DataPlaneCpu, path: PacketPath | None, rec: dict) -> float | None:
    """The board path's MB/s for `dp`'s primitive (None where the path states none), noted in
    `rec`: per packet on the board, spread over the bytes of the datagrams the process was
    measured with (so both sides of the share are per byte of the same packets)."""
    pps = path.pps.get(dp.primitive or "") if path else None
    if not pps:
        return None
    size = (cal.get("process_bytes") or {}).get(f"{dp.daemon}:{dp.primitive}") or path.bytes
    rec.update(board_path_pps=pps, board_path_bytes=size, board_path_source=path.source)
    if path.program:
        rec["board_path_program"] = path.program
    return pps * size / 1e6
