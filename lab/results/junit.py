"""Verdicts -> JUnit XML (the Apache Ant format GitHub, GitLab and Jenkins render).

One <testsuite> per profile, one <testcase> per case and check ("ok": every repetition ran;
then one per expectation that matches the case). A failure's message names the measured value,
the bound and the test statistic. Each suite's <properties> carry the lab and tool versions, the
kernel and the profile's data-plane path. The document validates against the Ant schema
(windyroad/JUnit-Schema, vendored in tests/data/junit/): <properties>, <system-out> and
<system-err> present in every suite, a timestamp without a time zone, no attributes on
<testsuites>.
"""

from __future__ import annotations

import socket
import time
import xml.etree.ElementTree as ET

from lab.results.verdicts import Verdict


def _props(manifest: dict, profile: str) -> list[tuple[str, str]]:
    out = [
        ("lab.version", str(manifest.get("lab_version", ""))),
        ("lab.git_revision", str(manifest.get("git_revision", ""))),
        ("kernel", str((manifest.get("kernel") or {}).get("release", ""))),
        ("run", str(manifest.get("run", ""))),
    ]
    prof = (manifest.get("profiles") or {}).get(profile) or {}
    desc = prof.get("describe") or {}
    out += [
        ("profile", profile),
        ("driver", str(prof.get("driver", ""))),
        ("datapath", str(prof.get("path", desc.get("path", "")))),
    ]
    for k in ("implementation", "version", "tools", "cipher", "mtu", "config_hash"):
        if desc.get(k) not in (None, ""):
            out.append((f"vpn.{k}", str(desc[k])))
    for tool, version in sorted((manifest.get("tool_versions") or {}).items()):
        out.append((f"tool.{tool}", str(version)))
    return [(k, v) for k, v in out if v != ""]


def _text(v: Verdict) -> str:
    lines = [v.message]
    if v.bound:
        lines.append(f"bound: {v.bound}")
    if v.measured_text:
        lines.append(f"measured: {v.measured_text}")
    elif v.measured is not None:
        lines.append(f"measured: {v.measured!r}")
    if v.statistic:
        lines.append(f"statistic: {v.statistic}")
    return "\n".join(lines)


def junit_xml(
    verdicts: list[Verdict],
    manifest: dict,
    *,
    seconds: dict[tuple, float] | None = None,
    hostname: str | None = None,
) -> bytes:
    """The JUnit document. `seconds`: (profile, impairment, test label) -> wall time of the
    case's repetitions (the "ok" testcase's time)."""
    seconds = seconds or {}
    host = hostname or (manifest.get("kernel") or {}).get("hostname") or socket.gethostname()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    created = str(manifest.get("created_utc", ""))[:19]
    root = ET.Element("testsuites")
    profiles = list(dict.fromkeys(v.profile for v in verdicts))
    for i, profile in enumerate(profiles):
        vs = [v for v in verdicts if v.profile == profile]
        times = [
            seconds.get((v.profile, v.impairment, v.test_label), 0.0) if v.check == "ok" else 0.0
            for v in vs
        ]
        suite = ET.SubElement(
            root,
            "testsuite",
            {
                "name": f"lab.check.{profile}",
                "package": "lab.check",
                "id": str(i),
                "timestamp": created or stamp,
                "hostname": host or "localhost",
                "tests": str(len(vs)),
                "failures": str(sum(v.status == "fail" for v in vs)),
                "errors": "0",
                "skipped": str(sum(v.status == "skip" for v in vs)),
                "time": f"{sum(times):.3f}",
            },
        )
        props = ET.SubElement(suite, "properties")
        for k, val in _props(manifest, profile):
            ET.SubElement(props, "property", {"name": k, "value": val})
        for v, t in zip(vs, times, strict=True):
            case = ET.SubElement(
                suite,
                "testcase",
                {
                    "classname": f"{profile}.{v.impairment}.{v.test_label}"
                    + (f".{v.point}" if v.point else ""),
                    "name": v.check if v.check == "ok" else f"{v.check}",
                    "time": f"{t:.3f}",
                },
            )
            if v.status == "fail":
                el = ET.SubElement(case, "failure", {"message": v.message, "type": v.kind})
                el.text = _text(v)
            elif v.status == "skip":
                ET.SubElement(case, "skipped", {"message": v.message})
        out = ET.SubElement(suite, "system-out")
        out.text = "\n".join(f"{v.status.upper()} {v.case} {v.check}: {v.message}" for v in vs)
        ET.SubElement(suite, "system-err").text = ""
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
