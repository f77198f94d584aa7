"""`lab run -o key=value`: overrides of a plan file's raw table, applied before it is validated
(lab.campaign.load.load_plan). CLI values win over every level of the file."""

from __future__ import annotations

import copy
import tomllib
from typing import Any

from lab.core.errors import ConfigError, did_you_mean

#: keys `-o key=value` accepts (the dotted ones reach into [topology])
OVERRIDE_KEYS = {
    "reps": "all repetitions (reps, impaired_reps and per-test reps) to this number",
    "impaired_reps": "repetitions at each impairment point",
    "duration_s": "duration_s of every test that takes one (wins over per-test values; "
    "`duration` is its old name)",
    "adaptive": "true or false: adaptive length of every test that has it (wins over per-test, but a bidir test keeps its own)",
    "adaptive_rel_pct": "the stop rule's target half-width (% of the mean) of every test that "
    "takes one (set as [defaults], wins over per-test values)",
    "profiles": "comma-separated profile specs",
    "impairments": "comma-separated impairment names ('none', presets) or ';'-separated specs",
    "tests": "comma-separated test labels to keep",
    "placement": "egress, ingress or middlebox",
    "timeout_s": "grace in seconds",
    "name": "plan name",
    "vm": "true or false: run inside the full-kernel VM",
    "topology.file": "topology file",
    "topology.topo": "topology entry",
    "topology.cpu": "CPU profile",
    "topology.dilation": 'time dilation factor (>= 1) or "auto"',
    "topology.nic_latency": '"auto", "on" or "off"',
    "topology.params.KEY": "one topology parameter",
}


def parse_override(text: str) -> tuple[str, Any]:
    """`key=value`; the value is read as a TOML value when it is one, else as a string."""
    if "=" not in text:
        raise ConfigError(
            f"expected key=value, got {text!r}; keys: {', '.join(OVERRIDE_KEYS)}", source="-o"
        )
    key, value = (s.strip() for s in text.split("=", 1))
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    return key, parsed


def _split_list(key: str, value: Any) -> list:
    if isinstance(value, list):
        return value
    if not isinstance(value, str):
        return [value]
    if key == "impairments" and ";" in value:
        # specs contain spaces and commas never; ';' separates full specs
        return [s.strip() for s in value.split(";") if s.strip()]
    return [s.strip() for s in value.split(",") if s.strip()]


def apply_overrides(raw: dict, overrides: list[str], *, source: str) -> dict:
    """Apply `-o key=value` to the raw plan. CLI values win over every level of the file."""
    raw = copy.deepcopy(raw)
    seen: set[str] = set()
    for text in overrides:
        key, value = parse_override(text)
        if key in seen:
            raise ConfigError(
                f"given twice ({', '.join(overrides)}); give each key once", source="-o", field=key
            )
        seen.add(key)
        if isinstance(value, str) and not value.strip():
            raise ConfigError(
                f"empty value; accepted: {OVERRIDE_KEYS.get(key, 'see OVERRIDE_KEYS')}",
                source="-o",
                field=key or "KEY",
            )
        if key == "reps":
            raw["reps"] = value
            raw["impaired_reps"] = value
            for t in raw.get("tests") or []:
                if isinstance(t, dict):
                    t.pop("reps", None)
        elif key in ("duration_s", "duration"):  # `duration`: the old name (load.ALIASES)
            raw.pop("duration", None)
            raw["duration_s"] = value
            for t in raw.get("tests") or []:
                if isinstance(t, dict):
                    t.pop("duration_s", None)
            if isinstance(raw.get("defaults"), dict):
                raw["defaults"].pop("duration_s", None)
        elif key == "adaptive_rel_pct":
            defaults = raw.setdefault("defaults", {})
            if not isinstance(defaults, dict):
                raise ConfigError("[defaults] must be a table", source=source, field="defaults")
            defaults[key] = value  # each test that takes it validates it (its range, its type)
            for t in raw.get("tests") or []:
                if isinstance(t, dict):
                    t.pop(key, None)
        elif key in ("profiles", "impairments"):
            raw[key] = _split_list(key, value)
        elif key == "tests":
            keep = _split_list(key, value)
            tests = [t for t in raw.get("tests") or [] if isinstance(t, dict)]
            labels = [str(t.get("name") or t.get("test")) for t in tests]
            unknown = [k for k in keep if k not in labels]
            if unknown:
                raise ConfigError(
                    f"no test labelled {unknown[0]!r} in the plan; labels: {', '.join(labels)}",
                    source="-o",
                    field="tests",
                )
            raw["tests"] = [t for t, lbl in zip(tests, labels, strict=True) if lbl in keep]
        elif key == "adaptive":
            raw["adaptive"] = value
            for t in raw.get("tests") or []:
                # a bidir test keeps its own (adaptive length reads one direction's series)
                if isinstance(t, dict) and t.get("bidir") is not True:
                    t.pop("adaptive", None)
        elif key in ("impaired_reps", "placement", "timeout_s", "name", "vm"):
            raw[key] = value
        elif key.startswith("topology."):
            parts = key.split(".")
            topo = raw.setdefault("topology", {})
            if not isinstance(topo, dict):
                raise ConfigError("[topology] must be a table", source=source, field="topology")
            if len(parts) == 2 and parts[1] in ("file", "topo", "cpu", "dilation", "nic_latency"):
                topo[parts[1]] = value
            elif len(parts) == 3 and parts[1] == "params":
                topo.setdefault("params", {})[parts[2]] = value
            else:
                raise ConfigError(
                    f"unknown override key {key!r}; accepted: {', '.join(OVERRIDE_KEYS)}",
                    source="-o",
                    field=key,
                )
        else:
            raise ConfigError(
                f"unknown override key {key!r}{did_you_mean(key, OVERRIDE_KEYS)}; accepted: "
                f"{', '.join(OVERRIDE_KEYS)}",
                source="-o",
                field=key,
            )
    return raw
