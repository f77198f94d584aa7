"""`lab render --check [--arch ARCH]`: rendered configs read by the binary that will read them.

No tunnel is brought up: each check is something the tool itself does without a peer, run
with this machine's build or, with --arch, with the board's build from that architecture's
root under qemu-user (lab.core.arch.emulate). One row per rendered file: which binary (path,
version, architecture) checked it and its verdict in its own words.

What can be checked offline, per driver (CHECKERS):
- openvpn: the option parser (`openvpn --cd DIR --config FILE --verb 0 --show-ciphers
  --show-digests`: every line of the file is parsed, inline blocks included, then the lists
  are printed and it exits before anything is opened), and the `cipher`, `data-ciphers` and
  `auth` names against those lists of that build, which count the file's `providers`
  (the parser takes any name; a build lacking the cipher refuses it only at start);
  certificates, keys and DH files by that build's openssl (x509, pkey, dhparam);
- the others have no offline reader (swanctl parses swanctl.conf only to send it to a
  running charon, `wg setconf` needs an interface, tincd reads its files when it starts):
  their rows say so (verdict "not checked") rather than passing silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lab.core import proc
from lab.core.arch.emulate import ArchRoot

NOT_CHECKABLE = {
    "strongswan": "swanctl parses swanctl.conf only to load it into a running charon",
    "wireguard": "wg reads a config only into an existing interface (wg setconf)",
    "tinc": "tincd reads its files only when it starts the tunnel",
}


@dataclass
class Check:
    node: str
    file: str
    checked_by: str  # "openvpn 2.6.14, arm64 (/usr/sbin/openvpn under qemu-aarch64-static)"
    ok: bool | None  # None: no check exists for this file
    detail: str


class Runner:
    """Runs a tool as the check wants it: this machine's build, or the board's (--arch)."""

    def __init__(self, arch: ArchRoot | None):
        self.arch = arch
        self._versions: dict[str, str] = {}

    def run(self, argv: list[str]):
        if self.arch is not None:
            return self.arch.run(argv)
        return proc.run(argv, check=False, timeout=60)

    def who(self, tool: str, version_argv: list[str]) -> str:
        if tool not in self._versions:
            cp = self.run(version_argv)
            lines = [ln for ln in (cp.stdout + cp.stderr).splitlines() if ln.strip()]
            first = lines[0] if lines else "version unknown"
            if self.arch is not None:
                where = (
                    f"{self.arch.arch.name} ({self.arch.find(tool)} under {self.arch.arch.qemu})"
                )
            else:
                where = f"this machine ({proc.which(tool) or tool})"
            self._versions[tool] = f"{' '.join(first.split()[:2])}, {where}"
        return self._versions[tool]


def _names(text: str, directive: str) -> list[str]:
    """The values of a one-argument directive, `data-ciphers A:B` split on ':' (OpenVPN's own
    line syntax: directive, whitespace, argument; '#' and ';' start comments)."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == directive:
            out += words[1].split(":")
    return out


#: PEM block -> the openssl command that reads it
PEM = {
    "BEGIN CERTIFICATE": ["x509", "-noout"],
    "PRIVATE KEY": ["pkey", "-noout"],
    "BEGIN DH PARAMETERS": ["dhparam", "-noout"],
}


def _pem(runner: Runner, node: str, d: Path, rel: str) -> Check | None:
    """A certificate, key or DH file read by the build's openssl (what OpenVPN links)."""
    text = (d / rel).read_text(errors="replace")
    for marker, argv in PEM.items():
        if marker in text:
            who = runner.who("openssl", ["openssl", "version"])
            cp = runner.run(["openssl", *argv, "-in", str(d / rel)])
            if cp.returncode != 0:
                lines = [ln for ln in cp.stderr.splitlines() if ln.strip()]
                return Check(node, rel, who, False, (lines or [f"exit {cp.returncode}"])[0])
            return Check(node, rel, who, True, f"openssl {argv[0]} read it")
    return None


def _openvpn(runner: Runner, node: str, d: Path, rel: str) -> Check:
    who = runner.who("openvpn", ["openvpn", "--version"])
    if not rel.endswith((".conf", ".ovpn")):
        return _pem(runner, node, d, rel) or Check(
            node, rel, who, None, "read through the node's .conf"
        )
    # one run: the parser reads the whole file (an error exits 1 before anything else), then
    # the build lists its ciphers and digests with the file's `providers` loaded (OpenSSL 3's
    # legacy provider holds BF-CBC), and exits without opening anything
    argv = ["openvpn", "--cd", str(d), "--config", rel, "--verb", "0"]
    cp = runner.run([*argv, "--show-ciphers", "--show-digests"])
    if cp.returncode != 0:
        lines = [ln for ln in (cp.stdout + cp.stderr).splitlines() if "error" in ln.lower()]
        return Check(node, rel, who, False, (lines or [f"exit {cp.returncode}"])[0].strip())
    known: dict[str, set[str]] = {"--show-ciphers": set(), "--show-digests": set()}
    section = known["--show-ciphers"]
    for ln in cp.stdout.splitlines():
        if "message digests are available" in ln:
            section = known["--show-digests"]
        elif ln.strip() and not ln.startswith(" "):
            section.add(ln.split()[0].upper())
    text = (d / rel).read_text()
    for show, directives in (
        ("--show-ciphers", ("cipher", "data-ciphers")),
        ("--show-digests", ("auth",)),
    ):
        for directive in directives:
            for name in _names(text, directive):
                if name.lower() != "none" and name.upper() not in known[show]:
                    return Check(
                        node, rel, who, False, f"{directive} {name}: not in this build's {show}"
                    )
    return Check(node, rel, who, True, "options parsed; cipher and digest names known")


CHECKERS: dict[str, Callable[[Runner, str, Path, str], Check]] = {"openvpn": _openvpn}


def check_rendered(result: dict, out: Path, arch: ArchRoot | None) -> list[Check]:
    """One Check per file of `result` (tunnel.render) as written under `out` (write_rendered)."""
    driver = result["profile"]["driver"]
    checker = CHECKERS.get(driver)
    runner = Runner(arch)
    rows = []
    for node, files in result["files"].items():
        for rel in files:
            if checker is None:
                why = NOT_CHECKABLE.get(driver, f"no offline check for {driver} configs")
                rows.append(Check(node, rel, "-", None, why))
            else:
                rows.append(checker(runner, node, out / node, rel))
    return rows
