"""Where the lab finds the files a user names, and where it writes results (issue 32 item 10).

One rule for every command that takes a topology, a plan or a VPN profile (`lab up`, `lab
render`, `lab run`, `lab check`, `lab profiles`, `--vpn`, a plan's `[topology] file` and
`profiles`):

1. An argument that contains a '/' or ends in the kind's suffix (.py for topologies, .toml for
   plans and profiles) is a path: it is looked up relative to the current directory (for a
   path written in a plan: relative to the plan's folder, then to the current directory).
2. A relative path that is not there is looked up in the installation, so
   `topologies/pi_pair_middlebox.py` typed in any folder finds the shipped file.
3. Any other word is a name, looked up in the installation's folder of that kind
   (`topologies/`, `plans/`, `vpn_profiles/`, and first $LAB_VPN_PROFILES for profiles), with
   or without its suffix.
4. When nothing matches, the error lists every place tried, the shipped names and the nearest
   of them ("did you mean").

Results go under $LAB_RUN_DIR when it is set, else under `runs/` of the current directory,
never into the installation unless that is where the user is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lab import REPO
from lab.core.errors import ConfigError, did_you_mean


@dataclass(frozen=True)
class Kind:
    noun: str  # in messages: "topology", "plan", "VPN profile"
    plural: str
    folder: str  # the installation's folder of this kind
    suffix: str  # the file name's ending
    env: str = ""  # a variable naming one more folder of names, searched first

    def dirs(self) -> list[Path]:
        extra = os.environ.get(self.env) if self.env else None
        return ([Path(extra)] if extra else []) + [REPO / self.folder]


KINDS = {
    "topology": Kind("topology", "topologies", "topologies", ".py"),
    "plan": Kind("plan", "plans", "plans", ".toml"),
    "profile": Kind("VPN profile", "VPN profiles", "vpn_profiles", ".toml", env="LAB_VPN_PROFILES"),
}


def is_path(kind: str, text: str) -> bool:
    """Rule 1: a '/' or the kind's suffix makes `text` a path, anything else is a name."""
    return "/" in text or text.endswith(KINDS[kind].suffix)


def shipped(kind: str) -> list[str]:
    """The names of `kind` the installation (and $LAB_VPN_PROFILES for profiles) holds."""
    k = KINDS[kind]
    names: set[str] = set()
    for d in k.dirs():
        if d.is_dir():
            names.update(p.stem for p in d.glob(f"*{k.suffix}") if not p.name.startswith("_"))
    return sorted(names)


def candidates(kind: str, text: str, bases: list[Path] | None = None) -> list[Path]:
    """Every place rule 1..3 looks for `text`, in order. `bases`: the folders a path is relative
    to (default: the current directory, as typed)."""
    k = KINDS[kind]
    p = Path(text)
    if p.is_absolute():
        return [p]
    out: list[Path] = []
    if is_path(kind, text):
        out += [b / p for b in bases] if bases else [p]
        if "/" in text:
            inside = REPO / p
            # an installation path only: `../x.toml` does not climb out of it
            if inside.resolve().is_relative_to(REPO):
                out.append(inside)
        else:  # `quick.toml`: also a file name in the folders of names
            out += [d / p for d in k.dirs()]
    else:
        out += [d / f"{text}{k.suffix}" for d in k.dirs()]
    return list(dict.fromkeys(out))


def locate(
    kind: str,
    text: str,
    *,
    source: str | None = None,
    field: str | None = None,
    bases: list[Path] | None = None,
) -> Path:
    """The file `text` names (module doc's rule), else a ConfigError naming `source` and `field`
    (default: the text itself), the places tried and the shipped names. A path found relative
    to the current directory is returned as typed; one found in the installation, absolute."""
    k = KINDS[kind]
    if not text:
        raise ConfigError(f"empty; accepted: a {k.noun} file or name", source=source, field=field)
    shown = repr(text) if len(text) <= 255 else repr(text[:60]) + "..."
    if max(len(part.encode()) for part in text.split("/")) > 255:
        raise ConfigError(
            f"path too long (a name may have 255 bytes): {shown}", source=source, field=field
        )
    tried = candidates(kind, text, bases)
    dirs = []
    for c in tried:
        try:
            if c.is_file():
                return c
            if c.is_dir():
                dirs.append(c)
        except OSError as e:  # ENAMETOOLONG and kin: no file of that name can exist
            raise ConfigError(f"{shown}: {e.strerror}", source=source, field=field) from None
    if dirs and dirs[0] == tried[0]:  # the path as typed is a folder
        raise ConfigError(
            f"{shown} is a directory, not a {k.noun} file ({k.suffix})", source=source, field=field
        )
    names = shipped(kind)
    near = did_you_mean(Path(text).name.removesuffix(k.suffix), names)
    places = ", ".join(str(c) for c in tried)
    if is_path(kind, text):
        what = f"{k.noun} file not found: {shown}{near}; looked for {places}"
    else:
        what = f"unknown {k.noun} {shown}{near}; not found: {places}"
    raise ConfigError(
        f"{what}; valid: a path, or one of the {k.plural} in "
        f"{'/'.join(str(d) for d in k.dirs())}: {', '.join(names)}",
        source=source,
        field=field,
    )


def results_root() -> Path:
    """Where run directories go: $LAB_RUN_DIR when set, else `runs/` of the current directory
    (an absolute path, so that it means the same after a chdir or inside the VM)."""
    env = os.environ.get("LAB_RUN_DIR")
    return Path(env).absolute() if env else Path.cwd() / "runs"
