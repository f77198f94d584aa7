"""Bring your own configs (issue 23): a profile that carries the user's own config files.

    driver = "openvpn"
    [configs]
    server = "server.conf"      # relative to the profile file
    client = "client.ovpn"

Each file is a Jinja2 template of the file the team really deploys. The lab fills in only what
it must own (underlay addresses, interface names, endpoints, ports, the tunnel addresses and
the secrets it generates per lab) through the placeholders listed in PLACEHOLDERS; every other
byte is the user's text, deployed as is (no trim_blocks: the rendered file keeps the template's
lines). load_configs() checks, before anything exists, that a file uses only known placeholders
and every placeholder its role needs (ConfigError naming the file and the placeholder).

Errors found later (the lab's own checks of the rendered text, the tools' own checkers: `wg
setconf`, `openvpn --test-crypto`, `swanctl --load-all`) name the user's file and its line:
rendered lines are mapped back to template lines by a diff of the two (file_error()).
docs/byoc.md lists the placeholders.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2
import jinja2.meta

from lab.core.errors import ConfigError
from lab.vpn.base import Endpoint, TunnelContext

ROLES = ("client", "server")

#: placeholders every driver's files may use
COMMON = {
    "node": "this end's node name",
    "peer_node": "the other end's node name",
    "role": "client or server",
    "profile": "the profile's name",
    "local_underlay": "this end's underlay IPv4 address (the one the peer reaches)",
    "peer_underlay": "the peer's underlay IPv4 address",
    "tunnel_v4": "this end's tunnel address with prefix (10.99.0.x/24)",
    "tunnel_v6": "this end's tunnel IPv6 address with prefix (fd99::x/64)",
    "peer_tunnel_v4": "the peer's tunnel IPv4 address (no prefix)",
    "peer_tunnel_v6": "the peer's tunnel IPv6 address (no prefix)",
    "tunnel_net_v4": "the tunnel network address (10.99.0.0)",
    "tunnel_mask_v4": "the tunnel netmask (255.255.255.0)",
    "tunnel_prefix_v4": "the tunnel network with prefix (10.99.0.0/24)",
    "tunnel_net_v6": "the IPv6 tunnel network with prefix (fd99::/64)",
}


@dataclass(frozen=True)
class DriverSpec:
    file: str  # the rendered file's name, as the driver deploys it
    placeholders: dict[str, str]  # name -> what the lab puts there
    #: role -> names each role needs ("a|b": either)
    required: dict[str, tuple[str, ...]]


SPECS: dict[str, DriverSpec] = {
    "wireguard": DriverSpec(
        "wg0.conf",
        {
            "address": "Address value: this end's tunnel addresses (v4, v6); the lab applies them",
            "private_key": "this end's private key (generated per lab)",
            "peer_public_key": "the peer's public key",
            "preshared_key": "a PresharedKey (generated per lab, same on both ends)",
            "listen_port": "the profile's listen_port",
            "peer_endpoint": "the peer's underlay address:listen_port",
            "peer_allowed_ips": "the peer's tunnel host addresses and the networks behind it",
        },
        {
            "client": ("address", "private_key", "peer_public_key", "peer_endpoint"),
            "server": ("address", "private_key", "peer_public_key"),
        },
    ),
    "openvpn": DriverSpec(
        "openvpn.conf",
        {
            "ifname": "the TUN device (dev), tun0",
            "port": "the profile's port",
            "remote": "the server's underlay address (client: remote)",
            "ca_cert": "inline <ca>: the per-lab CA certificate (PEM)",
            "cert": "inline <cert>: this end's certificate",
            "key": "inline <key>: this end's private key",
            "tls_crypt_key": "inline <tls-crypt>: a per-lab key",
            "tls_auth_key": "inline <tls-auth>: a per-lab key",
            "dh": "inline <dh>: DH parameters (RFC 7919 ffdhe2048)",
            "ca_file": "file name of the CA certificate (written beside the config)",
            "cert_file": "file name of this end's certificate",
            "key_file": "file name of this end's private key",
            "tls_crypt_file": "file name of the tls-crypt key",
            "tls_auth_file": "file name of the tls-auth key",
            "dh_file": "file name of the DH parameters",
        },
        {
            "client": (
                "ifname",
                "remote",
                "port",
                "ca_cert|ca_file",
                "cert|cert_file",
                "key|key_file",
            ),
            "server": ("ifname", "port", "ca_cert|ca_file", "cert|cert_file", "key|key_file"),
        },
    ),
    "strongswan": DriverSpec(
        "swanctl.conf",
        {
            "local_addr": "local_addrs: this end's underlay address",
            "remote_addr": "remote_addrs: the peer's underlay address",
            "psk": "the pre-shared key (generated per lab, 0s base64)",
            "local_ts": "local_ts: this end's tunnel host addresses and the networks behind it",
            "remote_ts": "remote_ts: the peer's",
        },
        {r: ("local_addr", "remote_addr", "psk", "local_ts", "remote_ts") for r in ROLES},
    ),
}

#: openvpn file placeholders -> (file name written beside the config, secret it holds)
OPENVPN_FILES = {
    "ca_file": ("ca.crt", "ca_cert"),
    "cert_file": ("cert.crt", "{role}_cert"),
    "key_file": ("key.pem", "{role}_key"),
    "tls_crypt_file": ("tls-crypt.key", "static_key"),
    "tls_auth_file": ("tls-auth.key", "static_key"),
    "dh_file": ("dh.pem", "dh"),
}


@dataclass(frozen=True)
class UserConfig:
    """One user file of a profile: its role, where it is, its text and hash, the placeholders
    it uses, and what the lab applies itself from it, read once at load time."""

    role: str
    path: Path
    text: str
    sha256: str
    names: frozenset[str]
    #: the tunnel MTU the file sets (a wg-quick [Interface] MTU, which `wg setconf` does not
    #: take: the lab sets it on the link); None: the profile's `mtu`
    mtu: int | None = None
    #: whether the file gives its own listening port (a wg-quick [Interface] ListenPort); when
    #: not, the lab gives wg the port the peer's Endpoint names
    listen_port: bool = False

    def to_json(self) -> dict:
        return {"file": str(self.path), "sha256": self.sha256}


def _env(directory: Path) -> jinja2.Environment:
    # no trim_blocks/lstrip_blocks: the user's text keeps every byte and line
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(directory)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def load_configs(driver: str, table: dict, profile_path: Path) -> dict[str, UserConfig]:
    """The profile's [configs] table checked: a driver that takes user files, a file per role,
    readable, known placeholders only, every placeholder the role needs. Pure."""
    src = str(profile_path)
    spec = SPECS.get(driver)
    if spec is None:
        raise ConfigError(
            f"driver {driver!r} takes no user config files; drivers that do: "
            + ", ".join(sorted(SPECS)),
            source=src,
            field="configs",
        )
    for key in table:
        if key not in ROLES:
            raise ConfigError(
                f"unknown role {key!r}; valid: {', '.join(ROLES)}",
                source=src,
                field=f"configs.{key}",
            )
    out = {}
    known = set(COMMON) | set(spec.placeholders)
    for role in ROLES:
        rel = table.get(role)
        if not isinstance(rel, str) or not rel:
            raise ConfigError(
                "missing: a file name per role (relative to the profile file)",
                source=src,
                field=f"configs.{role}",
            )
        path = (profile_path.parent / rel).resolve()
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(
                f"cannot read {path}: {getattr(e, 'strerror', None) or e}",
                source=src,
                field=f"configs.{role}",
            ) from None
        try:
            names = frozenset(jinja2.meta.find_undeclared_variables(_env(path.parent).parse(text)))
        except jinja2.TemplateSyntaxError as e:
            raise ConfigError(
                f"line {e.lineno}: not a valid template: {e.message}", source=str(path)
            )
        unknown = sorted(names - known)
        if unknown:
            raise ConfigError(
                f"unknown placeholder(s) {', '.join(unknown)}; valid for {driver}: "
                + ", ".join(sorted(known)),
                source=str(path),
                field=f"configs.{role}",
            )
        for need in spec.required[role]:
            alts = need.split("|")
            if not names & set(alts):
                shown = " or ".join("{{ " + a + " }}" for a in alts)
                raise ConfigError(
                    f"the {role}'s file must contain the placeholder {shown} "
                    f"({spec.placeholders.get(alts[0], '')}): the lab owns that value",
                    source=str(path),
                    field=f"configs.{role}",
                )
        out[role] = UserConfig(
            role,
            path,
            text,
            hashlib.sha256(text.encode()).hexdigest(),
            names,
            wg_mtu(text) if driver == "wireguard" else None,
            driver == "wireguard" and "listenport" in wg_interface(text),
        )
    return out


def tunnel_layout(driver: str, configs: dict[str, UserConfig]) -> tuple[int, int, bool]:
    """(client host number, server host number, IPv6 in the tunnel) for a profile with user
    files. OpenVPN's `server` directive gives the server the net's first address, so there the
    server is .1; IPv6 only when the files put it in (OpenVPN: a *_v6 placeholder)."""
    if driver == "openvpn":
        v6 = any(n.endswith("_v6") for c in configs.values() for n in c.names)
        return 2, 1, v6
    return 1, 2, True


# ------------------------------------------------------------------------ rendering


def common_values(ctx: TunnelContext, end: Endpoint, role: str) -> dict[str, str]:
    peer = ctx.peer(end)
    net4 = ipaddress.ip_interface(end.tunnel_v4).network
    net6 = ipaddress.ip_interface(end.tunnel_v6).network if end.tunnel_v6 else ""
    return {
        "node": end.name,
        "peer_node": peer.name,
        "role": role,
        "profile": ctx.profile,
        "local_underlay": end.underlay_v4,
        "peer_underlay": peer.underlay_v4,
        "tunnel_v4": end.tunnel_v4,
        "tunnel_v6": end.tunnel_v6,
        "peer_tunnel_v4": peer.tunnel_v4.split("/")[0],
        "peer_tunnel_v6": peer.tunnel_v6.split("/")[0],
        "tunnel_net_v4": str(net4.network_address),
        "tunnel_mask_v4": str(net4.netmask),
        "tunnel_prefix_v4": str(net4),
        "tunnel_net_v6": str(net6),
    }


def render(ctx: TunnelContext, driver: str, values_of) -> dict[str, dict[str, str]]:
    """{node: {file: text}}: each role's user file rendered with common_values() plus
    `values_of(end, role) -> (extra values, extra files)`."""
    spec = SPECS[driver]
    out = {}
    for role, end in (("client", ctx.client), ("server", ctx.server)):
        cfg = ctx.configs[role]
        values, files = values_of(end, role)
        text = (
            _env(cfg.path.parent)
            .from_string(cfg.text)
            .render(**common_values(ctx, end, role), **values)
        )
        out[end.name] = {spec.file: text, **files}
    return out


def config_of(ctx: TunnelContext, end: Endpoint) -> UserConfig:
    return ctx.configs["client" if end is ctx.client else "server"]


def template_line(template: str, rendered: str, lineno: int) -> int:
    """The template line (1-based) that produced rendered line `lineno`: lines the diff finds
    equal map one to one; a changed run (a placeholder, a multi-line value) maps to the first
    template line of its run; a changed run of as many lines on both sides (consecutive
    placeholder lines) maps one to one."""
    a, b = template.splitlines(), rendered.splitlines()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if j1 <= lineno - 1 < j2:
            one_to_one = tag == "equal" or i2 - i1 == j2 - j1  # a run of one-line values
            return i1 + 1 + (lineno - 1 - j1 if one_to_one else 0)
    return min(lineno, len(a))


def file_error(cfg: UserConfig, rendered: str, lineno: int | None, message: str) -> ConfigError:
    """A ConfigError naming the user's file and line (mapped from the rendered line)."""
    if lineno is None:
        return ConfigError(message, source=str(cfg.path))
    line = template_line(cfg.text, rendered, lineno)
    shown = cfg.text.splitlines()[line - 1].strip() if cfg.text.splitlines() else ""
    return ConfigError(f"line {line} ({shown!r}): {message}", source=str(cfg.path))


def line_of(text: str, pattern: str) -> int | None:
    """The first line (1-based) of `text` matching the regex `pattern`."""
    rx = re.compile(pattern)
    for n, line in enumerate(text.splitlines(), 1):
        if rx.search(line):
            return n
    return None


# ------------------------------------------------------------------------ wireguard


def wg_keys(text: str) -> list[tuple[int, str, str, str]]:
    """(line, section, key lowercased, value) of a wg-quick file (wg(8)'s `Key = Value` lines
    under [Interface]/[Peer]; '#' starts a comment)."""
    out, section = [], ""
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip().lower()
        elif "=" in line:
            key, value = (s.strip() for s in line.split("=", 1))
            out.append((n, section, key.lower(), value))
    return out


def wg_interface(text: str) -> dict[str, str]:
    """The [Interface] keys (lowercased) of a wg-quick file and their values, the last one
    given where a key repeats (as wg-quick reads it)."""
    return {k: v for _, sec, k, v in wg_keys(text) if sec == "interface"}


def wg_mtu(text: str) -> int | None:
    """The [Interface] MTU of a wg-quick file, or None when it sets none or no number."""
    v = wg_interface(text).get("mtu", "")
    return int(v) if v.isdigit() else None


def wg_check(cfg: UserConfig, rendered: str, peer: Endpoint) -> None:
    """The lab's own check (wg accepts the file): some [Peer]'s AllowedIPs must hold the peer's
    tunnel addresses, else WireGuard drops every packet from and to it."""
    allowed: list[tuple[int, str]] = [
        (n, v) for n, sec, k, v in wg_keys(rendered) if sec == "peer" and k == "allowedips"
    ]
    for addr in (peer.tunnel_v4, peer.tunnel_v6):
        host = addr.split("/")[0]
        if not host:
            continue
        ip = ipaddress.ip_address(host)
        nets = []
        for n, v in allowed:
            for x in (x.strip() for x in v.split(",") if x.strip()):
                try:
                    nets.append(ipaddress.ip_network(x, strict=False))
                except ValueError:
                    raise file_error(cfg, rendered, n, f"{x!r} is not an address/prefix") from None
        if not any(ip in net for net in nets if net.version == ip.version):
            fam = "{{ peer_tunnel_v4 }}/32" if ip.version == 4 else "{{ peer_tunnel_v6 }}/128"
            raise file_error(
                cfg,
                rendered,
                allowed[0][0] if allowed else None,
                f"AllowedIPs excludes the peer's tunnel address {host}: WireGuard would drop "
                f"its packets (add it, e.g. {fam}, or {{{{ peer_allowed_ips }}}})",
            )


def wg_setconf_error(cfg: UserConfig, rendered: str, setconf: str, stderr: str) -> ConfigError:
    """`wg setconf` refused the file: name the user's line it quotes (wg prints the line)."""
    m = re.search(r"Line unrecognized: `(.*)'", stderr) or re.search(r"`([^`']+)'", stderr)
    lineno = None
    if m:
        quoted = m.group(1).strip()
        lineno = line_of(rendered, r"^\s*" + re.escape(quoted.split("=")[0].strip()) + r"\s*=")
    return file_error(cfg, rendered, lineno, "wg setconf: " + " ".join(stderr.split()))


# ------------------------------------------------------------------------ openvpn


def openvpn_error(cfg: UserConfig, rendered: str, output: str) -> ConfigError:
    """OpenVPN's own option checker refused the file: its "FILE:N" names the line; else the
    first line of the option it names (--data-ciphers ...)."""
    msgs = [ln for ln in output.splitlines() if "error" in ln.lower() or "Unsupported" in ln]
    msg = " / ".join(" ".join(m.split()[2:]) if m[:2].isdigit() else m for m in msgs[-3:])
    m = re.search(r"\.conf:(\d+)|:(\d+): ", output)
    lineno = int(m.group(1) or m.group(2)) if m else None
    if lineno is None:
        opt = re.search(r"--([a-z][a-z0-9-]+)", " ".join(msgs))
        if opt:
            lineno = line_of(rendered, r"^\s*" + re.escape(opt.group(1)) + r"\b")
    return file_error(cfg, rendered, lineno, f"openvpn: {msg or output.strip()[-300:]}")


#: OpenVPN has no parse-only flag: --test-crypto stops after the option checks, and without
#: --secret its last check fails with this line, which therefore means "every option passed"
OPENVPN_PARSED = "You must define key file (--secret)"


# ------------------------------------------------------------------------ strongswan


def daemon_lines(log: str, limit: int = 4) -> list[str]:
    """The lines of a charon log that say why a negotiation failed."""
    rx = re.compile(
        r"NO_PROPOSAL_CHOSEN|no acceptable proposal|AUTHENTICATION_FAILED|TS_UNACCEPTABLE|"
        r"INVALID_KE|unacceptable|configured proposals|failed|error",
        re.IGNORECASE,
    )
    return [ln.strip() for ln in log.splitlines() if rx.search(ln)][:limit]


def hashes(configs: dict[str, UserConfig]) -> dict[str, dict]:
    """{role: {file, sha256}} for the run manifest."""
    return {role: c.to_json() for role, c in configs.items()}


def rejected_proposal(cfg: UserConfig, rendered: str, log: str) -> str:
    """Where a charon that refused its peer's proposals (its log: "configured proposals: IKE:"
    or "ESP:" then "... unacceptable") has them in the user's file: "FILE line N: ..." or ""."""
    m = re.search(
        r"configured proposals: (IKE|ESP):[^\n]*\n(?:[^\n]*\n){0,3}?[^\n]*(?:unacceptable|no acceptable)",
        log,
    )
    if not m:
        return ""
    key = "proposals" if m.group(1) == "IKE" else "esp_proposals"
    n = line_of(rendered, r"^\s*" + key + r"\s*=")
    if n is None:
        return f"{cfg.path}: no {key} line (strongSwan's default proposals were refused)"
    line = template_line(cfg.text, rendered, n)
    return f"{cfg.path} line {line}: {cfg.text.splitlines()[line - 1].strip()}"
