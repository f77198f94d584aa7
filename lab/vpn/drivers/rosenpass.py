"""WireGuard + Rosenpass: a post-quantum key exchange that feeds WireGuard's preshared key.

The WireGuard half is the wireguard driver's, imported, not copied (lab.vpn.drivers.wireguard:
the same wg0.conf, the same data planes: kernel or wireguard-go by `implementation`; boringtun
0.7.1 cannot take a key on a running peer, so it is refused when the profile loads).
Beside it on each end runs one `rosenpass exchange-config rosenpass.toml` (rosenpass 0.2, the
reference implementation in Rust): its UDP exchange (Classic McEliece 460896 static keys, Kyber
512 ephemeral ones, liboqs) derives a 32-byte key every two minutes and hands it to WireGuard
with `wg set wg0 peer <peer> preshared-key /dev/stdin`. WireGuard's own Noise handshake then mixes
that key in (the psk of Noise_IKpsk2): the tunnel holds if either X25519 or the post-quantum
exchange does. The client initiates (its rosenpass.toml names the server's endpoint); the server
answers whoever presents the client's public key.

start() returns only once rosenpass has installed the same key on both ends, before anything is
routed into wg0: WireGuard's first handshake (the lab's readiness ping) already uses the
post-quantum key, so the tunnel never carries a packet under X25519 alone. The time from the
first rosenpass launched to that moment, and what the underlay interfaces of both ends sent
meanwhile (their kernel counters: the rosenpass messages, with their UDP/IP/Ethernet headers and
any retransmission, and nothing else, as wg0 is still quiet), are kept in the lab's log directory
and handed to the `handshake` test by key_exchange().

Keys: per lab, made on the controller by `rosenpass gen-keys` (binary files: the public key is
Classic McEliece's 524,160 bytes) in the lab's secrets directory, 0600; the rendered
rosenpass.toml names them there (a board gets that directory synced like the config one), and
that directory's path is redacted like a key, so equal profiles hash equal across labs.

rosenpass is not a Debian package: `./setup.sh --with rosenpass` builds it with cargo into
${LAB_CACHE:-/var/cache/lab}/rosenpass, installing BUILD_PACKAGES first (liboqs is built through
cmake, its bindings through libclang; libsodium is linked). Not a `requires` Tool therefore
(those feed apt's packages.txt): check() looks for the binary and names the set-up option.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import ClassVar

from lab.core import proc
from lab.core.errors import ConfigError, PreconditionError, StartupError
from lab.core.node import Node
from lab.core.state import write_text_atomic
from lab.core.tools import SS
from lab.model.params import Param
from lab.vpn.base import Availability, Rekey, TunnelContext, render_template
from lab.vpn.drivers.wireguard import IFNAME, WireGuardDriver

#: where `./setup.sh --with rosenpass` installs rosenpass (cargo install --root)
ROSENPASS_ROOT = Path(os.environ.get("LAB_CACHE", "/var/cache/lab")) / "rosenpass"
ROSENPASS_SETUP = "sudo ./setup.sh --with rosenpass"
#: Debian packages the build needs (setup.sh --with rosenpass installs them from here): liboqs
#: builds with cmake, its Rust bindings are generated through libclang, libsodium is found by
#: pkg-config. Build-time only: the binary links libsodium (the driver's `packages`)
BUILD_PACKAGES = ("cmake", "libclang-dev", "libsodium-dev", "pkg-config")
#: the exchange's measurement of the last start(), in the lab's log directory
EXCHANGE_FILE = "rosenpass-exchange.json"
KEM = "Classic McEliece 460896 (static) + Kyber 512 (ephemeral), liboqs"


class RosenpassDriver(WireGuardDriver):
    name = "rosenpass"
    params: ClassVar[dict[str, Param]] = {
        **WireGuardDriver.params,
        "rosenpass_port": Param(
            int, 9999, "UDP port both ends' rosenpass listen on", min=1, max=65535
        ),
        "start_timeout": Param(
            float,
            30.0,
            "seconds to wait for rosenpass's first key on both ends (its retransmissions back "
            "off from 0.25-0.5 s)",
            min=1,
            max=600,
        ),
    }
    secret_markers = (*WireGuardDriver.secret_markers, "keys_dir")
    requires = (*WireGuardDriver.requires, SS)
    #: the binary's shared library (setup.sh installs it; `lab arch fetch` ships it)
    packages = ("libsodium23",)

    def tools(self, params: dict) -> list[str]:
        return [*super().tools(params), "ss"]

    def validate(self, params: dict, *, source: str) -> None:
        super().validate(params, source=source)
        if params["implementation"] == "boringtun":
            # seen here: after its first `wg setconf`, boringtun-cli 0.7.1 answers every
            # `wg set` with no errno ("Protocol error") and its UAPI then stops answering
            # (cloudflare/boringtun issues 40 and 326: a peer cannot be modified), while
            # rosenpass hands over each key as `wg set wg0 peer ... preshared-key`
            raise ConfigError(
                "boringtun 0.7.1 cannot take rosenpass's keys: it cannot modify a running "
                "peer (`wg set` fails with 'Protocol error' and its UAPI hangs; boringtun "
                "issues 40 and 326); accepted: 'auto', 'kernel', 'wireguard-go'",
                source=source,
                field="params.implementation",
            )
        if params["rosenpass_port"] == params["listen_port"]:
            raise ConfigError(
                f"{params['rosenpass_port']} is WireGuard's listen_port too; accepted: another "
                "UDP port",
                source=source,
                field="params.rosenpass_port",
            )

    def check(self, params: dict, node: Node) -> Availability:
        wg = super().check(params, node)
        if not wg.ok:
            return Availability(
                False,
                wg.path,
                f"no WireGuard for rosenpass to feed: params.implementation = "
                f"{params['implementation']!r}: {wg.why} (accepted: auto, kernel, wireguard-go, "
                "whichever this node has)",
            )
        if rosenpass_binary(node) is None:
            return Availability(
                False,
                wg.path,
                f"rosenpass not built (neither {ROSENPASS_ROOT}/bin/rosenpass nor on PATH): "
                f"run `{ROSENPASS_SETUP}`",
            )
        return wg

    # ---------------------------------------------------------------- secrets and configs
    def secrets(self, ctx: TunnelContext, params: dict) -> dict[str, str]:
        out = super().secrets(ctx, params)
        binary = str(ROSENPASS_ROOT / "bin" / "rosenpass")
        if not os.access(binary, os.X_OK):
            binary = proc.which("rosenpass") or ""
        if not binary:
            raise PreconditionError(f"rosenpass missing on the controller: run `{ROSENPASS_SETUP}`")
        # not base.make_secrets: it keeps text files, and these keys are binary; made in place
        # under the same umask, so neither file is ever readable by others
        d = ctx.secrets_dir
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        old = os.umask(0o077)  # both files born 0600
        try:
            for role in ("client", "server"):
                sk, pk = key_paths(d, role)
                for f in (sk, pk):
                    f.unlink(missing_ok=True)
                proc.run(
                    [binary, "gen-keys", "--secret-key", sk, "--public-key", pk],
                    where="controller",
                )
        finally:
            os.umask(old)
        out["keys_dir"] = str(d)
        return out

    def render(self, ctx: TunnelContext, params: dict, secrets: dict[str, str]) -> dict:
        rendered = super().render(ctx, params, secrets)
        keys = Path(secrets["keys_dir"])
        for role, end in (("client", ctx.client), ("server", ctx.server)):
            peer, prole = ctx.peer(end), "server" if role == "client" else "client"
            sk, pk = key_paths(keys, role)
            rendered[end.name]["rosenpass.toml"] = render_template(
                "rosenpass/rosenpass.toml.j2",
                node=end.name,
                role=role,
                profile=ctx.profile or self.name,
                secret_key=sk,
                public_key=pk,
                port=params["rosenpass_port"],
                peer_node=peer.name,
                peer_public_key=key_paths(keys, prole)[1],
                # the client initiates; the server answers (no endpoint: it learns the client's)
                peer_endpoint=f"{peer.underlay_v4}:{params['rosenpass_port']}"
                if role == "client"
                else None,
                ifname=IFNAME,
                peer_wg_public_key=secrets[f"{prole}_public"],
            )
        return rendered

    # ---------------------------------------------------------------- running
    def start(self, ctx: TunnelContext, params: dict, rendered: dict) -> None:
        wg = {e.name: {k: v for k, v in rendered[e.name].items() if k != "rosenpass.toml"}
              for e in ctx.ends()}  # fmt: skip
        super().start(ctx, params, wg)
        binary = rosenpass_binary(ctx.client.node)
        if binary is None:
            raise StartupError(f"rosenpass missing on {ctx.client.name}: run `{ROSENPASS_SETUP}`")
        before = {e.name: tx_counters(e) for e in ctx.ends()}
        t0 = time.monotonic()
        # the responder first, listening before the initiator's first message (a lost first
        # message costs rosenpass's first retransmission, 0.25-0.5 s later: no cost of the exchange)
        for end in (ctx.server, ctx.client):
            conf = ctx.write_config(end, {"rosenpass.toml": rendered[end.name]["rosenpass.toml"]})
            d = end.node.spawn(
                "rosenpass",
                [binary, "exchange-config", str(conf["rosenpass.toml"])],
                env={"RUST_LOG": "warn"},
            )
            ctx.daemons.append(d)
            if end is ctx.server:
                _wait_listening(end, d, params["rosenpass_port"], timeout=5.0)
        t_key = self._wait_psk(ctx, params["start_timeout"])
        after = {e.name: tx_counters(e) for e in ctx.ends()}
        sent = [(after[n][0] - before[n][0], after[n][1] - before[n][1]) for n in before]
        exchange = {
            "what": f"rosenpass {KEM} -> WireGuard preshared key",
            "ms": round((t_key - t0) * 1000, 1),
            "bytes": sum(b for b, _ in sent),
            "packets": sum(p for _, p in sent),
        }
        ctx.log_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(ctx.log_dir / EXCHANGE_FILE, json.dumps(exchange) + "\n")

    def _wait_psk(self, ctx: TunnelContext, timeout: float) -> float:
        """Until both ends' wg0 hold rosenpass's key for their peer (the same one); the moment."""
        deadline = time.monotonic() + timeout
        while True:
            keys = {e.name: psk_of(e.node) for e in ctx.ends()}
            now = time.monotonic()
            if all(keys.values()) and len(set(keys.values())) == 1:
                return now
            dead = [d for d in ctx.daemons if not d.alive()]
            if dead or now > deadline:
                without = [n for n, k in keys.items() if not k]
                why = (
                    f"{dead[0].name} on {dead[0].node} exited"
                    if dead
                    else (f"no key on {', '.join(without)}" if without else "the ends' keys differ")
                    + f" within {timeout:g} s"
                )
                tails = "".join(
                    f"\n--- {d.name} on {d.node} ---\n{d.log_tail(15)}"
                    for d in ctx.daemons
                    if d.name == "rosenpass"
                )
                raise StartupError(f"rosenpass: {why}{tails}")
            time.sleep(0.005)

    def key_exchange(self, ctx: TunnelContext, params: dict) -> dict | None:
        """The last start()'s post-quantum exchange: {what, ms, bytes, packets} (module doc)."""
        f = ctx.log_dir / EXCHANGE_FILE
        return json.loads(f.read_text()) if f.exists() else None

    def stop(self, ctx: TunnelContext, params: dict) -> None:
        (ctx.log_dir / EXCHANGE_FILE).unlink(missing_ok=True)
        super().stop(ctx, params)

    def rekey_support(self, params: dict) -> Rekey:
        return Rekey(
            False,
            "rosenpass renews its key on its own timer (every 120 s, a constant of rosenpass "
            "0.2: no command or option forces an exchange), and WireGuard's handshake timer "
            "has no knob either (REKEY_AFTER_TIME = 120 s)",
        )

    def describe(self, ctx: TunnelContext, params: dict) -> dict:
        desc = super().describe(ctx, params)
        binary = rosenpass_binary(ctx.client.node) or "rosenpass"
        version = ctx.client.node.run([binary, "--version"], check=False).stdout.strip()
        desc.update(
            implementation=f"{desc['implementation']} + Rosenpass",
            wireguard=desc["implementation"],
            rosenpass_version=version.splitlines()[0] if version else None,
            key_exchange=f"Rosenpass ({KEM}) -> WireGuard preshared key, renewed every 120 s",
            rosenpass_port=params["rosenpass_port"],
        )
        return desc


def key_paths(keys_dir: Path, role: str) -> tuple[Path, Path]:
    """(secret key, public key) files of one end in the secrets directory."""
    return keys_dir / f"rosenpass-{role}.sk", keys_dir / f"rosenpass-{role}.pk"


def rosenpass_binary(node: Node) -> str | None:
    """The rosenpass the node can execute: setup.sh's build, else one on PATH; None."""
    built = str(ROSENPASS_ROOT / "bin" / "rosenpass")
    missing = node.missing_tools([built, "rosenpass"])
    return next((b for b in (built, "rosenpass") if b not in missing), None)


def tx_counters(end) -> tuple[int, int]:
    """(bytes, packets) the end's underlay interface has transmitted (kernel counters)."""
    out = end.node.run(["ip", "-j", "-s", "link", "show", "dev", end.underlay_if]).stdout
    tx = json.loads(out)[0]["stats64"]["tx"]
    return int(tx["bytes"]), int(tx["packets"])


def psk_of(node: Node) -> str | None:
    """wg0's preshared key for its one peer, None while it has none."""
    cp = node.run(["wg", "show", IFNAME, "preshared-keys"], check=False)
    fields = cp.stdout.split()
    if cp.returncode != 0 or len(fields) < 2 or fields[1] == "(none)":
        return None
    return fields[1]


def _wait_listening(end, daemon, port: int, *, timeout: float) -> None:
    """Until the end's rosenpass has its UDP socket bound to `port`."""
    deadline = time.monotonic() + timeout
    while True:
        cp = end.node.run(["ss", "-Hun", "state", "all", f"( sport = :{port} )"], check=False)
        if cp.returncode == 0 and cp.stdout.strip():
            return
        if not daemon.alive() or time.monotonic() > deadline:
            what = "exited" if not daemon.alive() else f"not listening on UDP {port}"
            raise StartupError(f"rosenpass on {end.name} {what}\n{daemon.log_tail(15)}")
        time.sleep(0.005)
