"""`lab profiles import FILE... --out PROFILE.toml`: a team's own config files -> a profile that
carries them as templates (docs/byoc.md).

Reads wg-quick .conf, strongSwan swanctl.conf and OpenVPN .conf/.ovpn files and replaces what the
lab owns (addresses, endpoints, ports, interface names, keys) by the placeholders of
lab.vpn.userconfig, line for line, so the template keeps the user's text and line numbers (an
inline key block becomes one placeholder line). Secrets are never copied: a key or PSK the lab
cannot replace is dropped with its block. What cannot be carried over into a lab (wg-quick's DNS
and hooks, scripts, logging to a file of its own, routes outside the topology, more peers) is
commented out with the prefix `# lab import: ` and listed as a Note with its line number.
Pure text work: nothing is run.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from lab.core.errors import ConfigError
from lab.vpn import tunneladdr
from lab.vpn.charon import PROPOSAL_RE
from lab.vpn.profiles import load_profile

COMMENTED = "# lab import: "


@dataclass(frozen=True)
class Note:
    file: str
    line: int  # 1-based, in the user's file
    text: str
    why: str
    #: "not carried over" (commented out or kept and listed) or "replaced" (a value the lab
    #: could not keep, e.g. a tunnel network inside its underlay)
    kind: str = "not carried over"


@dataclass
class Template:
    source: Path
    lines: list[str]
    role: str = ""  # "client", "server" or "" (both)
    changed: set[int] = field(default_factory=set)  # the user's line numbers replaced
    #: (line, interface): this end's tunnel addresses as the file gives them, and the peer's
    #: where the file names them (an AllowedIPs host, OpenVPN's `server` net)
    addrs: list = field(default_factory=list)
    peer_addrs: list = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@dataclass
class Imported:
    driver: str
    templates: list[Template]
    params: dict
    notes: list[Note]
    #: role -> the tunnel's addresses ([tunnel] of the profile); None: the lab's layout
    tunnel: dict | None = None


def detect(text: str) -> str:
    if re.search(r"^\s*\[Interface\]", text, re.M | re.I):
        return "wireguard"
    if re.search(r"^\s*(connections|secrets)\s*\{", text, re.M):
        return "strongswan"
    if re.search(r"^\s*(client|remote|server|dev|tls-client|tls-server|<ca>)\b", text, re.M):
        return "openvpn"
    return ""


def import_files(paths: list[Path]) -> Imported:
    texts = []
    for p in paths:
        try:
            texts.append(p.read_text())
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read: {getattr(e, 'strerror', None) or e}", source=str(p))
    kinds = {detect(t) for t in texts}
    if "" in kinds:
        bad = next(p for p, t in zip(paths, texts, strict=True) if not detect(t))
        raise ConfigError(
            "not a wg-quick .conf, a swanctl.conf nor an OpenVPN config; accepted: those three",
            source=str(bad),
        )
    if len(kinds) > 1:
        raise ConfigError(
            "the files are of different kinds (" + ", ".join(sorted(kinds)) + "); give one "
            "technology's files",
            source=", ".join(map(str, paths)),
        )
    if not 1 <= len(paths) <= 2:
        raise ConfigError("give one file (both ends) or two (one per end)", source="FILE...")
    driver = kinds.pop()
    notes: list[Note] = []
    params: dict = {}
    tpls = [
        {"wireguard": _wireguard, "strongswan": _swanctl, "openvpn": _openvpn}[driver](
            p, t, notes, params
        )
        for p, t in zip(paths, texts, strict=True)
    ]
    _roles(driver, tpls, paths)
    texts_of = {str(p): t.splitlines() for p, t in zip(paths, texts, strict=True)}

    def note(source: Path, n: int, why: str) -> None:
        line = texts_of[str(source)][n - 1].strip()
        notes.append(Note(str(source), n, line, why, "replaced"))

    return Imported(driver, tpls, params, notes, tunneladdr.from_files(driver, tpls, note))


def _roles(driver: str, tpls: list[Template], paths: list[Path]) -> None:
    if len(tpls) == 1:
        if driver == "strongswan":
            raise ConfigError(
                "a site-to-site swanctl.conf names its own end: give both gateways' files, "
                "the initiator's first",
                source=str(paths[0]),
            )
        if driver == "openvpn":
            raise ConfigError("give the server's and the client's file", source=str(paths[0]))
        return
    guessed = [t.role for t in tpls]
    if driver == "strongswan" or guessed.count("client") != 1 or guessed.count("server") != 1:
        tpls[0].role, tpls[1].role = "client", "server"  # as given: the initiator first
    # else each file said which end it is (Endpoint / remote: the client)


def _comment(t: Template, n: int, notes: list[Note], why: str) -> None:
    notes.append(Note(str(t.source), n, t.lines[n - 1].strip(), why))
    t.lines[n - 1] = COMMENTED + t.lines[n - 1]
    t.changed.add(n)


def _set_value(t: Template, n: int, value: str) -> None:
    """Replace the value of a `key = value` line, keeping the key, spacing and comment."""
    line = t.lines[n - 1]
    m = re.match(r"^(\s*[^=]+?\s*=\s*)(.*?)(\s*#.*)?$", line)
    t.lines[n - 1] = m.group(1) + value + (m.group(3) or "")
    t.changed.add(n)


# ------------------------------------------------------------------------ wg-quick

WG_DROP = {"dns", "table", "preup", "postup", "predown", "postdown", "saveconfig"}


def _wireguard(path: Path, text: str, notes: list[Note], params: dict) -> Template:
    try:
        return _wireguard_lines(path, text, notes, params)
    except _BadValue as e:
        raise ConfigError(f"line {e.line}: {e.text!r} is not an address/prefix", source=str(path))


class _BadValue(Exception):
    def __init__(self, line: int, text: str):
        self.line, self.text = line, text


def _net(line: int, text: str, *, iface: bool = False):
    try:
        return ipaddress.ip_interface(text) if iface else ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise _BadValue(line, text) from None


def _wireguard_lines(path: Path, text: str, notes: list[Note], params: dict) -> Template:
    t = Template(path, text.splitlines())
    section, peers, nets = "", 0, []
    for n, raw in enumerate(list(t.lines), 1):
        line = raw.split("#", 1)[0].strip()
        if line.startswith("["):
            section = line.strip("[] ").lower()
            peers += section == "peer"
            if section == "peer" and peers > 1:
                _comment(t, n, notes, "a further peer: the lab's tunnel has one peer")
            continue
        if section == "peer" and peers > 1 and line:
            _comment(t, n, notes, "a further peer: the lab's tunnel has one peer")
            continue
        if "=" not in line:
            continue
        key, value = (s.strip() for s in line.split("=", 1))
        k = key.lower()
        if section == "interface":
            if k == "address":
                ifaces = [_net(n, a.strip(), iface=True) for a in value.split(",") if a.strip()]
                nets = [a.network for a in ifaces]
                t.addrs += [(n, a) for a in ifaces]
                _set_value(t, n, "{{ address }}")
            elif k == "privatekey":
                _set_value(t, n, "{{ private_key }}")
            elif k == "listenport":
                params["listen_port"] = int(value) if value.isdigit() else 51820
                _set_value(t, n, "{{ listen_port }}")
            elif k in WG_DROP:
                _comment(t, n, notes, "wg-quick only: the lab applies Address and MTU, not this")
        elif section == "peer":
            if k == "publickey":
                _set_value(t, n, "{{ peer_public_key }}")
            elif k == "presharedkey":
                _set_value(t, n, "{{ preshared_key }}")
            elif k == "endpoint":
                port = value.rsplit(":", 1)[-1]
                params.setdefault("listen_port", int(port) if port.isdigit() else 51820)
                _set_value(t, n, "{{ peer_endpoint }}")
                t.role = "client"
            elif k == "allowedips":
                _set_value(t, n, ", ".join(_allowed(t, n, value, nets, notes)))
    t.role = t.role or "server"
    return t


def _allowed(t: Template, n: int, value: str, nets: list, notes: list[Note]) -> list[str]:
    path, out = t.source, []
    for item in (x.strip() for x in value.split(",") if x.strip()):
        net = _net(n, item)
        fam = "v4" if net.version == 4 else "v6"
        inside = [a for a in nets if a.version == net.version and net.subnet_of(a)]
        if inside and net.num_addresses == 1:
            t.peer_addrs.append((n, ipaddress.ip_interface(f"{net[0]}/{inside[0].prefixlen}")))
            out.append(f"{{{{ peer_tunnel_{fam} }}}}/{net.prefixlen}")
        elif inside and net == inside[0]:
            out.append("{{ tunnel_prefix_v4 }}" if fam == "v4" else "{{ tunnel_net_v6 }}")
        else:
            if net.prefixlen:
                notes.append(
                    Note(str(path), n, item, "kept as is: a route outside the lab's topology")
                )
            out.append(item)
    return out


# ------------------------------------------------------------------------ swanctl.conf

SWAN_VALUES = {
    "local_addrs": "{{ local_addr }}",
    "remote_addrs": "{{ remote_addr }}",
    "local_ts": "{{ local_ts }}",
    "remote_ts": "{{ remote_ts }}",
}


def _swanctl(path: Path, text: str, notes: list[Note], params: dict) -> Template:
    t = Template(path, text.splitlines())
    block: list[str] = []
    for n, raw in enumerate(list(t.lines), 1):
        line = raw.split("#", 1)[0].strip()
        if line.endswith("{"):
            block.append(line[:-1].strip())
            continue
        if line == "}":
            block = block[:-1]
            continue
        if "=" not in line:
            continue
        key, value = (s.strip() for s in line.split("=", 1))
        if key in SWAN_VALUES:
            if key == "local_ts":
                t.addrs += tunneladdr.first_hosts(n, value)
            _set_value(t, n, SWAN_VALUES[key])
        elif block[:1] == ["secrets"] and key == "secret":
            if block[-1].startswith("ike"):
                _set_value(t, n, "{{ psk }}")
            else:
                _set_value(t, n, "NOT-CARRIED-OVER")
                notes.append(Note(str(path), n, f"{key} = ...", "a secret the lab does not own"))
        elif key == "updown":
            _comment(t, n, notes, "an updown script: the lab installs routes and policies")
        elif key in ("proposals", "esp_proposals") and PROPOSAL_RE.match(value):
            params.setdefault(f"{'ike' if key == 'proposals' else 'esp'}_proposals", value)
    return t


# ------------------------------------------------------------------------ OpenVPN

#: directive -> the placeholder(s) its arguments become
OVPN_ARGS = {
    "port": ["{{ port }}"],
    "dev": ["{{ ifname }}"],
    "local": ["{{ local_underlay }}"],
    "server": ["{{ tunnel_net_v4 }}", "{{ tunnel_mask_v4 }}"],
    "server-ipv6": ["{{ tunnel_net_v6 }}"],
    "ca": ["{{ ca_file }}"],
    "cert": ["{{ cert_file }}"],
    "key": ["{{ key_file }}"],
    "dh": ["{{ dh_file }}"],
    "tls-crypt": ["{{ tls_crypt_file }}"],
    "tls-auth": ["{{ tls_auth_file }}"],
}
OVPN_BLOCKS = {
    "ca": "ca_cert",
    "cert": "cert",
    "key": "key",
    "tls-crypt": "tls_crypt_key",
    "tls-auth": "tls_auth_key",
    "dh": "dh",
}
OVPN_DROP = {
    **dict.fromkeys(
        ("log", "log-append", "syslog", "daemon"), "logs elsewhere: the lab keeps the daemon's log"
    ),
    **dict.fromkeys(
        (
            "up",
            "down",
            "route-up",
            "ipchange",
            "client-connect",
            "client-disconnect",
            "learn-address",
            "tls-verify",
            "auth-user-pass-verify",
            "script-security",
            "plugin",
        ),
        "runs a script or plug-in the lab does not have",
    ),
    **dict.fromkeys(
        ("management", "auth-user-pass", "askpass", "crl-verify", "secret", "tls-crypt-v2"),
        "needs a file, a key or a prompt the lab does not provide",
    ),
    "route": "a route outside the lab's topology",
    "route-ipv6": "a route outside the lab's topology",
    "ifconfig": "point-to-point addresses: use `server` (the lab owns the tunnel addresses)",
}


def _openvpn(path: Path, text: str, notes: list[Note], params: dict) -> Template:
    src = text.splitlines()
    t = Template(path, [])
    remotes, inline = 0, None
    for n, raw in enumerate(src, 1):
        stripped = raw.strip()
        if inline is not None:  # inside <ca> ... </ca>: the key material is never copied
            if stripped == f"</{inline}>":
                t.lines.append(raw)
                inline = None
            t.changed.add(n)
            continue
        m = re.match(r"^<([a-z0-9-]+)>$", stripped)
        if m:
            inline = m.group(1)
            t.lines.append(raw)
            if inline in OVPN_BLOCKS:
                t.lines.append("{{ " + OVPN_BLOCKS[inline] + " }}")
            else:
                t.lines.append(f"{COMMENTED}<{inline}> content not carried over")
                notes.append(
                    Note(str(path), n, raw.strip(), "an inline block the lab does not own")
                )
            continue
        words = stripped.split()
        if not words or words[0][0] in "#;":
            t.lines.append(raw)
            continue
        d, lead = words[0], raw[: len(raw) - len(raw.lstrip())]
        if d in ("client", "tls-client", "remote"):
            t.role = "client"
        elif d in ("server", "tls-server", "mode") and t.role != "client":
            t.role = "server"
        if d == "remote":
            remotes += 1
            if remotes > 1:
                t.lines.append(COMMENTED + raw)
                notes.append(
                    Note(str(path), n, stripped, "a further remote: the lab has one server")
                )
            else:
                rest = words[3:]
                if len(words) > 2 and words[2].isdigit():
                    params["port"] = int(words[2])
                t.lines.append(lead + " ".join(["remote", "{{ remote }}", "{{ port }}", *rest]))
            t.changed.add(n)
        elif d in OVPN_ARGS and not (d == "dh" and words[1:2] == ["none"]):
            if d in ("server", "server-ipv6"):
                tunneladdr.openvpn_net(t, n, words)
            if d == "port" and words[1:2] and words[1].isdigit():
                params["port"] = int(words[1])
            if d == "dev" and not words[1:2] == ["tun"] and not words[1].startswith("tun"):
                notes.append(Note(str(path), n, stripped, "the lab runs a tun device"))
            code, hash_, comment = raw.partition("#")
            keep = code.split()[1 + len(OVPN_ARGS[d]) :]
            comment = hash_ + comment
            body = " ".join([d, *OVPN_ARGS[d], *keep])
            t.lines.append(lead + body + (f"  {comment}" if comment else ""))
            t.changed.add(n)
        elif d in OVPN_DROP or (d == "push" and "redirect-gateway" in stripped):
            why = OVPN_DROP.get(d, "would move the client's default route into the tunnel")
            t.lines.append(COMMENTED + raw)
            notes.append(Note(str(path), n, stripped, why))
            t.changed.add(n)
        else:
            t.lines.append(raw)
    return t


# ------------------------------------------------------------------------ writing


def import_profile(files: list[str], out: str | None) -> tuple[list[Path], Imported]:
    """`lab profiles import FILE... --out PROFILE.toml`: (files written, what was imported:
    its notes and tunnel addresses). Nothing is left written when the profile would not
    load."""

    if not files:
        raise ConfigError("give the config file(s) to import", source="lab profiles import")
    if not out:
        raise ConfigError(
            "missing: the profile file to write", source="lab profiles import", field="--out"
        )
    imported = import_files([Path(f) for f in files])
    target = Path(out)
    made = [d for d in (target.parent, *target.parent.parents) if not d.exists()]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)  # `--out team/wg.toml`: team/ made
    except OSError as e:
        raise ConfigError(
            f"cannot create the directory {target.parent}: {e.strerror}", source=out, field="--out"
        ) from None
    written: list[Path] = []
    try:
        written = write(imported, target)
        load_profile(out)  # what was written loads: placeholders and roles complete
    except ConfigError:
        for path in written:
            path.unlink(missing_ok=True)
        for d in made:  # innermost first: nothing is left
            d.rmdir()
        raise
    return written, imported


def write(imp: Imported, out: Path) -> list[Path]:
    """PROFILE.toml plus its templates beside it (NAME.<role>.<file> or NAME.<file>)."""
    if out.suffix != ".toml":
        raise ConfigError("must end in .toml (the profile file)", source=str(out), field="--out")
    stem = out.stem
    written, configs, names = [], {}, []
    for t in imp.templates:
        name = f"{stem}.{t.role + '.' if t.role and len(imp.templates) > 1 else ''}{t.source.name}"
        names.append(name if name.endswith(".j2") else name + ".j2")
    for path in [out, *(out.parent / n for n in names)]:
        if path.exists():  # nothing is overwritten, nothing written when one would be
            raise ConfigError(
                "exists; choose another profile name", source=str(path), field="--out"
            )
    for t, name in zip(imp.templates, names, strict=True):
        (out.parent / name).write_text(t.text)
        written.append(out.parent / name)
        for role in (t.role,) if len(imp.templates) > 1 else ("client", "server"):
            configs[role] = name
    sources = ", ".join(str(t.source) for t in imp.templates)
    lines = [
        f'driver = "{imp.driver}"',
        f'description = "imported by lab profiles import from {_toml_str(sources)}"',
        "",
        "[params]",
        *(f"{k} = {v!r}".replace("'", '"') for k, v in sorted(imp.params.items())),
        "",
        "[configs]",
        *(f'{role} = "{_toml_str(configs[role])}"' for role in ("client", "server")),
        "",
        *(tunneladdr.toml_lines(imp.tunnel) if imp.tunnel else []),
    ]
    text = "\n".join(lines)
    tomllib.loads(text)  # what we write must read back
    out.write_text(text)
    return [out, *written]


def _toml_str(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')
