"""scp: copy a file of a given size to a real sshd in the server node; time and rate.

sshd runs from an explicit config (no PAM, no passwords, listening only on the target address,
its own host key, authorized_keys and pid file) written into a fresh 0700 directory under the
lab's private state, never into results; keys are generated per run and removed after it.
The file sent is written once per lab, node and size and reused (`prepare_payload`). The
client pins the host key (StrictHostKeyChecking=yes with its own known_hosts) and ignores every
user or system ssh config (-F /dev/null), so the same cipher negotiation happens everywhere
unless `cipher` is set. The time includes the SSH handshake, as a user's scp does.

A copy that cannot finish before its time-out is stopped once that is clear (`stop_early`,
on by default; lab.measure.progress has the rule): its record fails as a timed-out one does,
with the partial figures in their own fields, never in `rate_bps`/`seconds`.

With `adaptive = true` the copy stops as it streams (lab.measure.progress.Stream): once the
stop rule is met over the received file's per-second rates, `seconds` is the time it ran plus
the rest of the file at the interval's mean rate (`projected = true`, `copied_bytes`); a copy
faster than the card's write rate runs to its end (docs/measurements.md).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from lab.core import proc
from lab.core.errors import StartupError
from lab.core.node import Node
from lab.measure.base import (
    Context,
    Metric,
    Primary,
    Record,
    Test,
    describe_failure,
    family_of,
    wait_listening,
)
from lab.model.params import Param
from lab.model.storageprofile import STORAGE_MARKER
from lab.core.tools import SS, Tool
from lab.measure.adaptive import ADAPTIVE_METRICS, ADAPTIVE_SCHEMA, adaptive_block, columns, rule_of
from lab.measure.progress import Stream, file_bytes, watch_copy
from lab.measure.tcpsender import sender_argv
from lab.measure.tcpstream import bytes_received, socket_reader, ss_argv

MIB = 1024 * 1024
#: OpenSSH >= 9.0 speaks SFTP underneath scp; -O forces the legacy protocol that older
#: releases (like the studies' boards) used; writing /dev/null over SFTP also draws a harmless
#: "remote fsetstat" warning. Both flags need OpenSSH 9.0+; "default" passes neither.
PROTOCOL_FLAGS = {"default": [], "scp": ["-O"], "sftp": ["-s"]}
#: `dest` default: the received file lands on the server's storage, as on a board's card
STORAGE = "storage"


def storage_of(node: Node, state: Path) -> dict | None:
    """The board storage `node`'s scratch directory `state` is on (its STORAGE_MARKER: a lab
    whose board profile models the card mounts it there, lab.substrate.local.storage), None
    when it is on no board's storage."""
    r = node.run(["cat", str(state / STORAGE_MARKER)], check=False)
    if r.returncode != 0:
        return None
    try:
        return json.loads(r.stdout)
    except ValueError:
        return None


def card_record(marker: dict | None) -> dict | None:
    """What a record says of the card the file went to."""
    if not marker:
        return None
    m = marker.get("model") or {}
    keep = ("card", "write_mbps", "dirty_limit_bytes")
    return {**{k: m.get(k) for k in keep}, "mechanism": marker.get("mechanism")}


def sshd_config(*, addr: str, port: int, state: Path) -> str:
    """The whole sshd configuration: nothing is inherited from /etc/ssh."""
    return "\n".join(
        [
            f"Port {port}",
            f"ListenAddress {addr.strip('[]')}",
            f"HostKey {state / 'ssh_host_ed25519_key'}",
            f"PidFile {state / 'sshd.pid'}",
            f"AuthorizedKeysFile {state / 'authorized_keys'}",
            "UsePAM no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            # the state directory may sit under a group-writable tree; keys are still 0600
            "StrictModes no",
            "UseDNS no",
            "PrintMotd no",
            "X11Forwarding no",
            "Subsystem sftp internal-sftp",
            "LogLevel VERBOSE",
            "",
        ]
    )


def scp_argv(
    *,
    key: Path,
    known_hosts: Path,
    port: int,
    src: Path,
    user: str,
    addr: str,
    dest: str,
    cipher: str | None,
    protocol: str = "default",
) -> list[str]:
    host = addr.strip("[]")
    if family_of(host) == 6:
        host = f"[{host}]"
    argv = ["scp", "-F", "/dev/null", "-i", str(key), "-P", str(port)]
    argv += ["-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes"]
    argv += ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "LogLevel=ERROR"]
    if cipher:
        argv += ["-c", cipher]
    argv += PROTOCOL_FLAGS[protocol]
    return argv + [str(src), f"{user}@{host}:{dest}"]


def _stream_info(st: Stream) -> dict:
    """What held a streamed copy (the record's adaptive.stream)."""
    return {
        "source": st.source,
        "held_by_card": st.held_by_card,
        "held_by_cycles": st.held_by_cycles,
        **st.why,
    }


def payload_path(root: Path, size_mb: int) -> Path:
    return root / f"scp-payload-{size_mb}MiB.bin"


def prepare_payload(node: Node, root: Path, size_mb: int) -> tuple[Path, float | None]:
    """The file a copy sends: one per lab, node and size in the lab's scratch directory `root`
    (on the node's card where its board profile models one), written once from /dev/urandom and
    synced, then reused by every later copy of the lab, as a board's file sits on its card
    before a copy is timed. Returns the path and the seconds the writing took (None: reused).
    Written under a temporary name and renamed, so a copy never sends a half-written file; it
    goes with the lab's directory at teardown."""
    path = payload_path(root, size_mb)
    r = node.run(["stat", "-c", "%s", str(path)], check=False)
    if r.returncode == 0 and r.stdout.strip() == str(size_mb * MIB):
        return path, None
    part = path.with_name(f"{path.name}.{secrets.token_hex(4)}.part")
    t0 = time.monotonic()
    try:
        # conv=fsync: the card has written the file back before the copy starts, so the
        # first copy of a lab meets an idle card as every later one does
        argv = ["dd", "if=/dev/urandom", f"of={part}", "bs=1M", f"count={size_mb}"]
        node.run([*argv, "conv=fsync", "status=none"], timeout=600)
        node.run(["mv", "-f", "--", str(part), str(path)])
    except BaseException:
        node.run(["rm", "-f", "--", str(part)], check=False)
        raise
    return path, round(time.monotonic() - t0, 3)


def _write(node: Node, path: Path, text: str) -> None:
    node.run(["tee", str(path)], input=text)
    node.run(["chmod", "0600", str(path)])


class ScpTest(Test):
    name = "scp"
    plots = ("throughput",)
    ranks = "throughput"
    client_tools = ("scp", "ssh-keygen", "dd")
    server_tools = ("sshd", "ssh-keygen", "ss")
    requires = (
        Tool("scp", "openssh-client"),
        # scp's transport; the manifest records its version as the lab's OpenSSH
        Tool("ssh", "openssh-client", ("ssh", "-V"), board=True),
        Tool("ssh-keygen", "openssh-client"),
        Tool("dd", "coreutils"),
        Tool("sshd", "openssh-server", board=True),
        SS,
    )
    schema: ClassVar[dict[str, Param]] = {
        "size_mb": Param(int, 256, min=1, max=65536, doc="file size in MiB"),
        "port": Param(int, 2222, min=1, max=65535),
        "cipher": Param(str, None, optional=True, doc="scp -c, e.g. aes128-gcm@openssh.com"),
        "dest": Param(
            str,
            STORAGE,
            doc='path written on the server; "storage": a file in the test\'s directory when '
            "that is on the server's board storage (the card a board profile's [storage] "
            "models: docs/cpu.md), else /dev/null",
        ),
        "protocol": Param(str, "default", choices=tuple(PROTOCOL_FLAGS), doc="scp -O / -s"),
        "stop_early": Param(
            bool,
            True,
            doc="stop a copy once even twice its rate cannot finish it before its time-out "
            "(lab.measure.progress); false: run to the time-out as before",
        ),
        **ADAPTIVE_SCHEMA,
    }
    metrics = (
        Metric(
            "throughput_bps",
            unit="bit/s",
            description="rate_bps = file size x 8 / seconds",
            source="rate_bps",
        ),
        Metric("seconds", unit="s", description="transfer time, SSH handshake included"),
        # a copy stopped early (failed record): its partial figures, never throughput/seconds
        Metric(
            "stopped_after_s",
            unit="s",
            description="a copy stopped early (stopped_early): seconds it ran",
            summarised=False,
        ),
        Metric(
            "partial_bytes",
            unit="B",
            description="a copy stopped early: bytes its interface sent (headers included)",
            summarised=False,
        ),
        Metric(
            "partial_rate_bps",
            unit="bit/s",
            description="a copy stopped early: the rate the rule used (best of the last 10 s "
            "and the average)",
            summarised=False,
        ),
        Metric(
            "projected_s",
            unit="s",
            description="a copy stopped early: when it would have ended at that rate",
            summarised=False,
        ),
        Metric(
            "copied_bytes",
            unit="B",
            description="adaptive: bytes of the file received when the copy was stopped (by "
            "the rule, or at its time-out with the rule's interval: `projected`)",
            summarised=False,
        ),
        *ADAPTIVE_METRICS,
    )
    primary = Primary("throughput_bps", "Mbit/s", 1e-6, True)

    def estimate_s(self, params: Mapping[str, Any]) -> float:
        return 1.0 + params["size_mb"] * 8 / 100  # ~100 Mbit/s through a capped tunnel

    def run(self, ctx: Context, params: Mapping[str, Any]) -> list[Record]:
        state = ctx.state_path() / f"scp-{secrets.token_hex(4)}"
        nodes = [ctx.server] if ctx.server is ctx.client else [ctx.server, ctx.client]
        for node in nodes:
            node.run(["mkdir", "-p", "-m", "0700", str(ctx.state_path()), str(state)])
        daemon = None
        files: list[Path] = []
        size = params["size_mb"] * MIB
        dest, card = params["dest"], None
        if dest == STORAGE:
            card = storage_of(ctx.server, ctx.state_path())
            dest = str(state / "received.bin") if card else "/dev/null"
        base = {
            "size_bytes": size,
            "cipher": params["cipher"],
            "dest": params["dest"],
            # where the file went: on the server's board storage (held to its card) or not
            "dest_path": dest,
            "storage": card_record(card),
            "protocol": params["protocol"],
            "stop_early": params["stop_early"],
        }
        try:
            host_key, client_key = state / "ssh_host_ed25519_key", state / "id_ed25519"
            for node, key in ((ctx.server, host_key), (ctx.client, client_key)):
                node.run(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "lab-scp", "-f", str(key)]
                )
            client_pub = ctx.client.run(["cat", f"{client_key}.pub"]).stdout
            host_pub = ctx.server.run(["cat", f"{host_key}.pub"]).stdout.split()
            _write(ctx.server, state / "authorized_keys", client_pub)
            host = ctx.server_addr.strip("[]")
            known = f"[{host}]:{params['port']} {host_pub[0]} {host_pub[1]}\n"
            _write(ctx.client, state / "known_hosts", known)
            cfg = state / "sshd_config"
            _write(ctx.server, cfg, sshd_config(addr=host, port=params["port"], state=state))
            user = ctx.server.run(["id", "-un"]).stdout.strip()
            payload, prepared_s = prepare_payload(ctx.client, ctx.state_path(), params["size_mb"])
            # the lab's first copy of this size wrote it (seconds), a later one reused it
            base["payload"] = {"reused": prepared_s is None, "prepare_s": prepared_s}

            sshd = proc.which("sshd") or "/usr/sbin/sshd"  # sshd re-execs itself: absolute path
            # privilege separation directory Debian's service unit normally creates
            ctx.server.run(["mkdir", "-p", "-m", "0755", "/run/sshd"], check=False)
            test = ctx.server.run([sshd, "-t", "-f", str(cfg)], check=False)
            if test.returncode != 0:
                raise StartupError(f"sshd rejected its config {cfg}:\n{test.stderr.strip()}")
            log = ctx.next_raw("sshd", ".log")
            files.append(log)
            daemon = ctx.server.spawn(
                f"sshd-scp-{params['port']}", [sshd, "-D", "-e", "-f", str(cfg)], log=log
            )
            wait_listening(ctx.server, daemon, proto="tcp", port=params["port"])

            argv = scp_argv(
                key=client_key,
                known_hosts=state / "known_hosts",
                port=params["port"],
                src=payload,
                user=user,
                addr=host,
                dest=dest,
                cipher=params["cipher"],
                protocol=params["protocol"],
            )
            # a Pi moves ~10-40 MB/s through scp; allow 1 MiB/s before calling it hung
            timeout = params["size_mb"] + ctx.timeout_s
            stream = None
            if params["adaptive"] and dest != "/dev/null":
                model = (card or {}).get("model") or {}
                write = model.get("write_mbps")
                stream = Stream(
                    rule_of(params, loss_abs=None),
                    size,
                    lambda: file_bytes(ctx.server, dest),
                    card_Bps=float(write) * 1e6 if write else None,
                    # ssh's sending socket and the client's counters (the interval decides
                    # alone where ss fails: ""), and the receiving sshd's bytes_received (the
                    # file's size decides where ss fails: None)
                    sender=socket_reader(
                        ctx.client,
                        sender_argv(ss_argv(params["port"], local=False)),
                        str,  # the text itself: sender_state and tcp_timeouts read it each
                    ),
                    received=socket_reader(
                        ctx.server, ss_argv(params["port"], local=True), bytes_received
                    ),
                )
            elif params["adaptive"]:
                base["adaptive_note"] = "not applied: the file goes to /dev/null, no bytes to read"
            inv, watch = watch_copy(
                ctx,
                ctx.client,
                argv,
                label="scp",
                timeout=timeout,
                size=size,
                addr=host,
                # the give-up rule watches too, but stops a copy only once its streaming ended
                # (an unreadable file): a streamed copy's time-out is its cap, not a failure
                enabled=params["stop_early"],
                stream=stream,
            )
            files += inv.raw_files
            if params["stop_early"] and watch.stream is None:
                base["early_stop"] = watch.info(timeout)
            v = watch.stopped
            if v is not None:
                return [
                    self.record(
                        ok=False,
                        error=f"scp {v.why}",
                        raw_files=files,
                        stopped_early=True,
                        stopped_after_s=watch.elapsed_s,
                        partial_bytes=watch.sent,
                        partial_rate_bps=v.rate * 8 if v.rate is not None else None,
                        projected_s=v.projected_s,
                        **base,
                    )
                ]
            st = watch.stream
            if st is not None and st.decision is None and inv.timed_out:
                st.at_cap()  # the cap: the rate as far as it got, if the rule has an interval
            if st is not None and st.decision is not None and inv.returncode != 0:
                # stopped by the streaming rule or at the cap (a copy that ended by itself
                # meanwhile counts whole)
                seconds = st.projected_s()
                reason = "ci" if st.decision.stop else "cap"
                info = adaptive_block(reason, st.decision, st.rule, measured_s=st.samples[-1][0],
                                      cap_s=timeout, unit="B/s")  # fmt: skip
                info["stream"] = _stream_info(st)
                return [
                    self.record(
                        raw_files=files,
                        seconds=seconds,
                        rate_bps=size * 8 / seconds,
                        handshake_included=True,
                        stopped_early=False,
                        projected=True,
                        copied_bytes=st.samples[-1][1],
                        adaptive=info,
                        **columns(info),
                        **base,
                    )
                ]
            if inv.timed_out or inv.returncode != 0:
                return [
                    self.record(
                        ok=False,
                        error=describe_failure(inv, "scp"),
                        raw_files=files,
                        stopped_early=False,
                        **base,
                    )
                ]
            if st is not None:  # adaptive, and the copy ran to its end: the file is the cap
                info = adaptive_block("cap", st.evaluate(), st.rule, measured_s=inv.seconds,
                                      cap_s=timeout, unit="B/s")  # fmt: skip
                info["stream"] = _stream_info(st)
                base.update(adaptive=info, **columns(info))
            elif watch.unstreamable:
                base["adaptive_note"] = f"not applied: {watch.unstreamable}"
            return [
                self.record(
                    raw_files=files,
                    seconds=inv.seconds,
                    rate_bps=size * 8 / inv.seconds,
                    handshake_included=True,
                    stopped_early=False,
                    projected=False,
                    **base,
                )
            ]
        finally:
            if daemon is not None:
                ctx.server.stop(daemon)
            for node in nodes:  # the received file with it
                node.run(["rm", "-rf", "--", str(state)], check=False)
