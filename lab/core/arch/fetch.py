"""`lab arch fetch ARCH`: a board's Debian 12 packages unpacked into a root, host untouched.

The caller names the top-level packages (lab.substrate.tools.board_packages(): the packages of
the tools declared with `Tool.board` and the drivers' plug-ins); apt resolves their
dependencies with a
private configuration: its own sources (Debian 12 for ARCH only), package lists, cache and an
empty dpkg status file under /var/cache/lab/arch/.apt-ARCH, and APT::Architecture=ARCH. So no
`dpkg --add-architecture`, nothing installed, nothing in /etc/apt or /var/lib/dpkg written;
fetch() compares `dpkg --print-foreign-architectures` before and after and says so if it
changed. Every package is unpacked with `dpkg-deb -x` (no maintainer script runs) into a
staging directory that replaces the root in one rename; the root's manifest records what was
fetched, with versions.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lab.core import proc
from lab.core.errors import PreconditionError
from lab.core.state import write_json_atomic
from lab.core.arch import MANIFEST, Arch, cache_dir, root_dir

SUITES = (
    ("http://deb.debian.org/debian", "bookworm"),
    ("http://deb.debian.org/debian", "bookworm-updates"),
    ("http://deb.debian.org/debian-security", "bookworm-security"),
)
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
SCHEMA = 1


@dataclass(frozen=True)
class FetchPlan:
    arch: Arch
    root: Path
    apt_dir: Path
    packages: tuple[str, ...]
    #: package -> why the lab wants it (recorded in the root's manifest)
    why: dict[str, str]

    def sources_text(self) -> str:
        return "".join(
            f"deb [arch={self.arch.name} signed-by={KEYRING}] {uri} {suite} main\n"
            for uri, suite in SUITES
        )

    def apt_options(self) -> list[str]:
        """apt-get options that keep every file apt reads or writes private to the lab."""
        d = self.apt_dir
        opts = {
            "APT::Architecture": self.arch.name,
            "APT::Architectures": self.arch.name,
            "Dir::State": d / "state",
            "Dir::State::status": d / "state" / "status",
            "Dir::Cache": d / "cache",
            "Dir::Etc::SourceList": d / "sources.list",
            "Dir::Etc::SourceParts": d / "sources.list.d",
            "Dir::Etc::Preferences": d / "preferences",
            "Dir::Etc::PreferencesParts": d / "preferences.d",
            "Debug::NoLocking": "false",
            "Acquire::Retries": "3",
        }
        out = []
        for k, v in opts.items():
            out += ["-o", f"{k}={v}"]
        return out

    def commands(self) -> list[list[str]]:
        """The apt commands fetch() runs, in order (unpacking follows, one dpkg-deb -x per
        downloaded file)."""
        apt = ["apt-get", "-q", *self.apt_options()]
        return [
            [*apt, "update"],
            [*apt, "install", "-y", "--download-only", "--no-install-recommends", *self.packages],
        ]

    def archives(self) -> Path:
        return self.apt_dir / "cache" / "archives"


def plan(arch: Arch, packages: Mapping[str, str]) -> FetchPlan:
    """The fetch of `packages` ({Debian package: why}) for `arch`."""
    return FetchPlan(
        arch,
        root_dir(arch),
        cache_dir() / f".apt-{arch.name}",
        tuple(sorted(packages)),
        dict(sorted(packages.items())),
    )


def read_manifest(root: Path) -> dict | None:
    try:
        return json.loads((root / MANIFEST).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def present(p: FetchPlan) -> dict | None:
    """The manifest of an unpacked root holding every package of the plan, else None."""
    m = read_manifest(p.root)
    if m and m.get("arch") == p.arch.name and set(p.packages) <= set(m.get("requested", [])):
        return m
    return None


def foreign_architectures() -> list[str]:
    return proc.run(["dpkg", "--print-foreign-architectures"]).stdout.split()


def _prepare_apt_dir(p: FetchPlan) -> None:
    d = p.apt_dir
    for sub in ("state/lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    # nothing is "installed" in the private status: apt downloads the whole closure (libc too)
    (d / "state" / "status").write_text("")
    (d / "sources.list").write_text(p.sources_text())


def fetch(p: FetchPlan, *, force: bool = False) -> dict:
    """Download and unpack; returns the manifest. Quick when the root already has it all."""
    if not force:
        m = present(p)
        if m:
            return {**m, "already_present": True}
    for tool in ("apt-get", "dpkg-deb", "dpkg", p.arch.qemu):
        proc.require(tool, "lab arch fetch: apt with a private configuration, qemu-user-static")
    before = foreign_architectures()
    t0 = time.monotonic()
    _prepare_apt_dir(p)
    arch_dir = p.archives()
    for old in arch_dir.glob("*.deb"):  # what a previous fetch left: only this plan's files
        old.unlink()
    for argv in p.commands():
        proc.run(argv, timeout=1800, where=f"lab arch fetch {p.arch.name}")
    debs = sorted(arch_dir.glob("*.deb"))
    if not debs:
        raise PreconditionError(f"apt downloaded nothing into {arch_dir}")
    downloaded = time.monotonic() - t0
    staging = p.root.with_name(p.root.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    fields = "${Package}\t${Version}\t${Architecture}\n"
    packages = []
    for deb in debs:
        name, version, arch = (
            proc.run(["dpkg-deb", "--show", f"--showformat={fields}", str(deb)])
            .stdout.strip()
            .split("\t")
        )
        packages.append({"package": name, "version": version, "arch": arch, "file": deb.name})
        proc.run(["dpkg-deb", "-x", str(deb), str(staging)], timeout=300)
    _ld_cache(p, staging)
    after = foreign_architectures()
    manifest = {
        "schema": SCHEMA,
        "arch": p.arch.name,
        "distribution": "Debian 12 (bookworm)",
        "sources": p.sources_text().splitlines(),
        "requested": list(p.packages),
        "why": p.why,
        "packages": packages,
        "fetched": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "download_seconds": round(downloaded, 1),
        "total_seconds": round(time.monotonic() - t0, 1),
        "size_bytes": _du(staging),
        "host_foreign_architectures": {"before": before, "after": after},
    }
    write_json_atomic(staging / MANIFEST, manifest)
    old = p.root.with_name(p.root.name + ".old")
    if p.root.exists():
        p.root.rename(old)
    staging.rename(p.root)
    shutil.rmtree(old, ignore_errors=True)
    if before != after:
        raise PreconditionError(
            f"the host's foreign architectures changed during the fetch ({before} -> {after}); "
            "something else ran dpkg --add-architecture"
        )
    return manifest


def _ld_cache(p: FetchPlan, root: Path) -> None:
    """The root's /etc/ld.so.cache, made by the root's own ldconfig under qemu-user, chrooted
    into the root (-r) so that it reads and writes only there. No maintainer script ran, so
    there was none; without it the board's ld.so searches its library directories, and under
    qemu-user its stat() of a directory reaches this machine (where /lib/arm-linux-gnueabihf
    does not exist): armhf's ld.so then gave up on that directory and missed libc.so.6."""
    qemu = proc.require(p.arch.qemu, "lab arch fetch builds the root's ld.so.cache with it")
    proc.run([qemu, "-L", str(root), str(root / "sbin/ldconfig"), "-X", "-r", str(root)])
    if not (root / "etc/ld.so.cache").is_file():
        raise PreconditionError(f"ldconfig made no {root}/etc/ld.so.cache")


def _du(path: Path) -> int:
    total = 0
    for f in path.rglob("*"):
        if f.is_file() and not f.is_symlink():
            total += f.stat().st_size
    return total
