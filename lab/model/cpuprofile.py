"""CPU profiles: data files in cpu_profiles/ that say how to make a node behave like a board.

A profile says what the board is (cores, clock, word size), what it can do (reference throughput
per crypto primitive, each with its source), and how to strip this machine down to the board's
instruction set (environment masks every process of a capped node gets). This module is the files:
their fields, their validation (errors name the file, the field and what is accepted), and
loading one by name. `lab calibrate` measures this machine and fits `core_share` (host cores per
board core); the result lives in a machine-local calibration file (lab.model.cpucalibration) that
`load_cpu_profile` merges in. lab.substrate.local.cpuplan turns profiles into per-node cgroup quotas.
"""

from __future__ import annotations

from lab import REPO
import hashlib
import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.core.errors import ConfigError, reject_unknown
from lab.model.boardkernel import (
    BoardKernel,
    UserspaceDataPlane,
    parse_kernel_table,
    parse_userspace_table,
)
from lab.model.cpucalibration import CORE_SHARE_MAX, apply_calibration
from lab.model.storageprofile import StorageModel, parse_storage

PROFILE_DIR = REPO / "cpu_profiles"
#: variables that hide CPU features from crypto libraries: a node with a CPU profile gets exactly
#: the profile's values, and the caller's own values of the others are removed (a `host` node
#: must not inherit an OPENSSL_ia32cap the user happened to export)
MASK_VARS = ("OPENSSL_ia32cap", "OPENSSL_armcap", "GODEBUG")

#: primitives a reference may name -> how `lab calibrate` measures them on this machine
PRIMITIVES: dict[str, dict[str, str]] = {
    "aes-128-gcm": {"tool": "openssl", "evp": "aes-128-gcm"},
    "aes-256-gcm": {"tool": "openssl", "evp": "aes-256-gcm"},
    "aes-128-cbc": {"tool": "openssl", "evp": "aes-128-cbc"},
    "aes-256-cbc": {"tool": "openssl", "evp": "aes-256-cbc"},
    "chacha20-poly1305": {"tool": "openssl", "evp": "chacha20-poly1305"},
    # HMAC-SHA1's hash: OpenVPN's static-key data channel (auth SHA1, study A) and tinc 1.0
    "sha1": {"tool": "openssl", "evp": "sha1"},
    # x/crypto's AEAD, as used by wireguard-go; measured by tools/gobench
    "go-chacha20-poly1305": {"tool": "go"},
    # OpenSSH's ciphers (scp): the ssh client's bytes per CPU second through a real sshd
    # (lab/campaign/calibssh.py); chacha20-poly1305@openssh.com is OpenSSH's default and the scp test's
    "ssh-chacha20-poly1305": {"tool": "ssh", "cipher": "chacha20-poly1305@openssh.com"},
    "ssh-aes128-gcm": {"tool": "ssh", "cipher": "aes128-gcm@openssh.com"},
    "ssh-aes128-ctr": {"tool": "ssh", "cipher": "aes128-ctr"},
    # the kernel's crypto API (kernel WireGuard, XFRM ESP, MACsec, dm-crypt): a reference is a
    # record of the board's figure only; `lab calibrate` cannot measure it here as the board
    # would run it (not maskable per namespace, not fully quota-scaled: coverage())
    "kernel-aes-128-cbc": {"tool": "kernel"},
    # the board kernel's AEADs of its data planes (XFRM ESP rfc4106/rfc7539esp, MACsec gcm(aes),
    # kernel WireGuard's chacha20poly1305): the speed a stand-in data plane is held to
    # (lab.model.boardkernel)
    "kernel-gcm-aes-128": {"tool": "kernel"},
    "kernel-gcm-aes-256": {"tool": "kernel"},
    "kernel-chacha20-poly1305": {"tool": "kernel"},
    # ESP's rfc7539esp, in the NET_RX softirq (no kernel-mode NEON there on 32-bit ARM)
    "kernel-esp-chacha20-poly1305": {"tool": "kernel"},
    # per-packet kernel work (syscalls, small copies): UnixBench's loops, tools/unixloops; a
    # residual under core_share, never fitted (lab/campaign/calibpacket.py)
    "unixbench-pipe": {"tool": "syscall", "loop": "pipe"},
    "unixbench-syscall": {"tool": "syscall", "loop": "syscall"},
}

#: the board OS's network defaults a profile may state ([os] table): key -> sysctl. All are per
#: network namespace, so each node gets its board's values whatever this machine uses (this
#: host defaults to bbr and a 32 MB tcp_rmem; a Pi 4 runs cubic with 6 MB)
OS_SYSCTLS = {
    "tcp_congestion_control": "net.ipv4.tcp_congestion_control",
    "tcp_rmem": "net.ipv4.tcp_rmem",
    "tcp_wmem": "net.ipv4.tcp_wmem",
}

#: the board's link model ([link] table): one-way time a frame spends in ONE traversal of the
#: board's NIC (MAC, DMA, interrupt and softirq hand-off, PHY), added per hop by the lab where
#: the VPN path crosses that board (lab.substrate.local.cpuplan.nic_path; docs/cpu.md "A board model")
LINK_FIELDS = ("nic_latency_us", "source", "derivation")
#: accepted range of nic_latency_us: 0 (no NIC latency) to 10 ms, far above any Ethernet NIC
NIC_LATENCY_MAX_US = 10_000.0
#: `nic_latency` lab option (`-p nic_latency=`, a plan's [topology] nic_latency)
NIC_LATENCY_MODES = ("auto", "on", "off")

_TOP_FIELDS = {
    "kernel",
    "userspace",
    "link",
    "os",
    "name",
    "description",
    "cores",
    "emulated_cores",
    "clock_mhz",
    "word_bits",
    "arch",
    "core_share",
    "calibrated",
    "env",
    "reference",
    "assumptions",
    "storage",
}
_REF_FIELDS = {
    "mbps",
    "source",
    "derivation",
    "weight",
    "confidence",
    "implementation",
    "kernel",
    "unit",
}
#: a reference's unit: MB/s (10^6 bytes/s), or loops/s for a loop that moves no bytes (UnixBench's
#: figures, quoted as published); the figure is in `mbps` either way
REF_UNITS = ("MB/s", "loops/s")
_CONFIDENCE = ("high", "medium", "low")


def profile_dirs() -> list[Path]:
    extra = os.environ.get("LAB_CPU_PROFILES")
    return ([Path(extra)] if extra else []) + [PROFILE_DIR]


def known_profiles() -> list[str]:
    names = set()
    for d in profile_dirs():
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.toml"))
    return sorted(names)


@dataclass(frozen=True)
class Reference:
    """What one board core does for one primitive (MB/s = 10^6 bytes/s, 16 KiB messages)."""

    primitive: str
    mbps: float
    source: str
    derivation: str = ""
    weight: float = 1.0
    confidence: str = "medium"
    #: the code that runs it on the board (kernel references: the crypto API driver names)
    implementation: str = ""
    #: the board kernel a kernel reference assumes, e.g. "5.10 armv7l"
    kernel: str = ""
    #: what `mbps` counts (REF_UNITS)
    unit: str = "MB/s"


@dataclass
class CpuProfile:
    name: str
    cores: int  # board cores; 0 = no cap (the host as it is)
    core_share: float  # host cores per board core (calibrated, else the file's placeholder)
    calibrated: bool
    env: dict[str, str] = field(default_factory=dict)
    description: str = ""
    #: board cores' worth of CPU time one node gets (before scaling; default: all its cores).
    #: Above 1 the node gets one capped group per core (lab/substrate/local/coreslots.py) where the host can
    emulated_cores: float = 1.0
    clock_mhz: int | None = None
    word_bits: int | None = None
    arch: str = ""
    references: dict[str, Reference] = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)
    path: str = ""
    calibration: dict | None = None  # summary of the merged calibration file
    #: the board's kernel: its data planes' threading and crypto ([kernel], lab.model.boardkernel)
    kernel: BoardKernel | None = None
    #: the board's userspace data planes' own packet paths ([userspace], lab.model.boardkernel)
    userspace: dict[str, UserspaceDataPlane] = field(default_factory=dict)
    uncalibrated_reason: str = ""
    #: the board OS's network defaults, sysctl -> value ([os], OS_SYSCTLS), and their source
    os: dict[str, str] = field(default_factory=dict)
    os_source: str = ""
    #: one-way latency of one traversal of the board's NIC, us ([link]; 0 = none stated)
    nic_latency_us: float = 0.0
    nic_source: str = ""
    nic_derivation: str = ""
    #: the board's storage ([storage]; lab.model.storageprofile), None if not stated
    storage: StorageModel | None = None

    @property
    def capped(self) -> bool:
        return self.cores > 0

    @property
    def quota_cores(self) -> float | None:
        """Host cores' worth of CPU time one node gets before fitting to the host, None if uncapped."""
        return None if not self.capped else self.emulated_cores * self.core_share

    def fingerprint(self) -> str:
        """Hash of what a calibration depends on: the references it measures or fits, and the
        masks. Editing either makes an existing calibration stale. The board kernel's figures
        (tool "kernel") are left out: `lab calibrate` runs none of them, and a lab prices its
        stand-ins with the profile's figure when it comes up (lab.model.boardkernel.plan), as it
        does with the board's packet paths, so editing one needs no new calibration."""
        measured = {
            k: r
            for k, r in self.references.items()
            if PRIMITIVES.get(k, {}).get("tool") != "kernel"
        }
        data = {
            "references": {k: [r.mbps, r.weight] for k, r in sorted(measured.items())},
            "env": dict(sorted(self.env.items())),
        }
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------- loading


def _find(name: str) -> Path:
    for d in profile_dirs():
        p = d / f"{name}.toml"
        if p.is_file():
            return p
    raise ConfigError(
        f"unknown CPU profile {name!r}; valid: {', '.join(known_profiles())}", source="cpu"
    )


def _num(
    v: Any,
    src: str,
    fld: str,
    *,
    integer: bool = False,
    minimum: float | None = None,
    positive: bool = False,
) -> float:
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"must be {kind}, got {v!r}", source=src, field=fld)
    if positive and v <= 0:
        raise ConfigError(f"must be > 0, got {v!r}", source=src, field=fld)
    if minimum is not None and v < minimum:
        raise ConfigError(f"must be >= {minimum}, got {v!r}", source=src, field=fld)
    return v


def _str(v: Any, src: str, fld: str) -> str:
    if not isinstance(v, str):
        raise ConfigError(f"must be a string, got {v!r}", source=src, field=fld)
    return v


def _choice(v: Any, accepted: tuple[str, ...], src: str, fld: str) -> str:
    if v not in accepted:
        raise ConfigError(f"must be one of {', '.join(accepted)}, got {v!r}", source=src, field=fld)
    return v


def parse_profile(name: str, data: dict, src: str) -> CpuProfile:
    """Validate a profile's TOML data. Errors name the file, the field and what is accepted."""
    reject_unknown(data, sorted(_TOP_FIELDS), source=src)
    if "name" in data and data["name"] != name:
        raise ConfigError(
            f"is {data['name']!r} but the file is {name}.toml; they must match",
            source=src,
            field="name",
        )
    for req in ("cores", "core_share"):
        if req not in data:
            raise ConfigError("missing (required: cores, core_share)", source=src, field=req)
    cores = int(_num(data["cores"], src, "cores", integer=True, minimum=0))
    core_share = float(_num(data["core_share"], src, "core_share", positive=True))
    if core_share > CORE_SHARE_MAX:
        raise ConfigError(
            f"must be <= {CORE_SHARE_MAX:g} host cores per board core, got {core_share}",
            source=src,
            field="core_share",
        )
    emulated = float(_num(data.get("emulated_cores", cores), src, "emulated_cores", minimum=0))
    if cores and not 0 < emulated <= cores:
        raise ConfigError(
            f"must be in (0, cores={cores}], got {emulated}", source=src, field="emulated_cores"
        )
    word_bits = data.get("word_bits")
    if word_bits is not None and word_bits not in (32, 64):
        raise ConfigError(f"must be 32 or 64, got {word_bits!r}", source=src, field="word_bits")
    clock = data.get("clock_mhz")
    if clock is not None:
        clock = int(_num(clock, src, "clock_mhz", integer=True, positive=True))
    calibrated = data.get("calibrated", cores == 0)
    if not isinstance(calibrated, bool):
        raise ConfigError(
            f"must be true or false, got {calibrated!r}", source=src, field="calibrated"
        )
    env = data.get("env", {})
    if not isinstance(env, dict):
        raise ConfigError('must be a table of NAME = "value"', source=src, field="env")
    for k, v in env.items():
        _str(v, src, f"env.{k}")
    assumptions = data.get("assumptions", [])
    if not isinstance(assumptions, list) or not all(isinstance(a, str) for a in assumptions):
        raise ConfigError("must be a list of strings", source=src, field="assumptions")

    refs_raw = data.get("reference", {})
    if not isinstance(refs_raw, dict):
        raise ConfigError(
            "must be a table of [reference.PRIMITIVE] tables", source=src, field="reference"
        )
    refs: dict[str, Reference] = {}
    for prim, r in refs_raw.items():
        where = f"reference.{prim}"
        if prim not in PRIMITIVES:
            raise ConfigError(
                f"unknown primitive {prim!r}; accepted: {', '.join(PRIMITIVES)}",
                source=src,
                field=where,
            )
        if not isinstance(r, dict):
            raise ConfigError("must be a table with mbps and source", source=src, field=where)
        reject_unknown(r, sorted(_REF_FIELDS), source=src, where=where)
        for req in ("mbps", "source"):
            if req not in r:
                raise ConfigError(
                    "missing (every reference needs mbps and source)",
                    source=src,
                    field=f"{where}.{req}",
                )
        conf = _choice(r.get("confidence", "medium"), _CONFIDENCE, src, f"{where}.confidence")
        unit = _choice(r.get("unit", "MB/s"), REF_UNITS, src, f"{where}.unit")
        refs[prim] = Reference(
            primitive=prim,
            mbps=float(_num(r["mbps"], src, f"{where}.mbps", positive=True)),
            source=_str(r["source"], src, f"{where}.source"),
            derivation=_str(r.get("derivation", ""), src, f"{where}.derivation"),
            weight=float(_num(r.get("weight", 1.0), src, f"{where}.weight", positive=True)),
            confidence=conf,
            implementation=_str(r.get("implementation", ""), src, f"{where}.implementation"),
            kernel=_str(r.get("kernel", ""), src, f"{where}.kernel"),
            unit=unit,
        )
    if cores and not refs:
        raise ConfigError(
            f"a capped profile (cores={cores}) needs reference throughputs to calibrate against; "
            f"add [reference.PRIMITIVE] tables (accepted primitives: {', '.join(PRIMITIVES)})",
            source=src,
            field="reference",
        )
    if cores and not any(PRIMITIVES[p]["tool"] == "openssl" for p in refs):
        raise ConfigError(
            "needs at least one OpenSSL primitive to fit the quota on",
            source=src,
            field="reference",
        )
    os_table = data.get("os", {})
    if not isinstance(os_table, dict):
        raise ConfigError('must be a table of NAME = "value"', source=src, field="os")
    reject_unknown(os_table, [*OS_SYSCTLS, "source"], source=src, where="os")
    os_sysctls = {
        OS_SYSCTLS[k]: " ".join(_str(v, src, f"os.{k}").split())
        for k, v in os_table.items()
        if k != "source"
    }
    if os_sysctls and not os_table.get("source"):
        raise ConfigError("say where the values come from (source = ...)", source=src, field="os")
    nic = _link_table(data.get("link", {}), src)
    kernel = parse_kernel_table(data.get("kernel"), src, refs, PRIMITIVES)
    # a userspace path leaves out its cipher, priced by the board's figure for a primitive the
    # process runs itself (not a kernel driver's, not a loop's)
    ciphers = {
        k: r for k, r in refs.items() if r.unit == "MB/s" and PRIMITIVES[k].get("tool") != "kernel"
    }
    userspace = parse_userspace_table(data.get("userspace"), src, ciphers)
    return CpuProfile(
        name=name,
        cores=cores,
        core_share=core_share,
        calibrated=calibrated,
        os=os_sysctls,
        os_source=_str(os_table.get("source", ""), src, "os.source"),
        nic_latency_us=nic["nic_latency_us"],
        nic_source=nic["source"],
        nic_derivation=nic["derivation"],
        storage=parse_storage(data.get("storage"), src),
        env={str(k): v for k, v in env.items()},
        description=_str(data.get("description", ""), src, "description"),
        emulated_cores=emulated,
        clock_mhz=clock,
        word_bits=word_bits,
        arch=_str(data.get("arch", ""), src, "arch"),
        references=refs,
        kernel=kernel,
        userspace=userspace,
        assumptions=list(assumptions),
        path=src,
    )


def _link_table(table: Any, src: str) -> dict:
    """The [link] table: nic_latency_us in [0, NIC_LATENCY_MAX_US], with its source and
    derivation (a figure without a source is refused, as for [reference.*] and [os])."""
    if not isinstance(table, dict):
        raise ConfigError(
            f"must be a table with {', '.join(LINK_FIELDS)}", source=src, field="link"
        )
    reject_unknown(table, LINK_FIELDS, source=src, where="link")
    out = {"nic_latency_us": 0.0, "source": "", "derivation": ""}
    if not table:
        return out
    if "nic_latency_us" not in table:
        raise ConfigError(
            f"missing; accepted: microseconds from 0 to {NIC_LATENCY_MAX_US:g}",
            source=src,
            field="link.nic_latency_us",
        )
    v = table["nic_latency_us"]
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= NIC_LATENCY_MAX_US:
        raise ConfigError(
            f"got {v!r}; accepted: microseconds from 0 to {NIC_LATENCY_MAX_US:g}",
            source=src,
            field="link.nic_latency_us",
        )
    for f in ("source", "derivation"):
        if not table.get(f):
            raise ConfigError(
                "missing: say where the figure comes from and how it was derived",
                source=src,
                field=f"link.{f}",
            )
        out[f] = _str(table[f], src, f"link.{f}")
    out["nic_latency_us"] = float(v)
    return out


def parse_nic_latency(value: Any, *, source: str, field: str = "nic_latency") -> str:
    """The lab's `nic_latency` option: "auto", "on" or "off" (case-insensitive); anything else
    is refused naming `source`, `field` and the accepted values."""
    if isinstance(value, str) and value.strip().lower() in NIC_LATENCY_MODES:
        return value.strip().lower()
    raise ConfigError(
        f"got {value!r}; accepted: {', '.join(NIC_LATENCY_MODES)}", source=source, field=field
    )


def load_cpu_profile(name: str, *, merge_calibration: bool = True) -> CpuProfile:
    """Load and validate cpu_profiles/NAME.toml and merge this machine's calibration if valid."""
    p = _find(name)
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not valid TOML: {e}", source=str(p))
    prof = parse_profile(name, data, str(p))
    if merge_calibration and prof.capped:
        apply_calibration(prof)
    return prof
