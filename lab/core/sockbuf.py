"""A running process's UDP socket receive buffers, read and set from outside the process.

The lab's userspace stand-ins for a board's kernel data plane (wireguard-go for kernel
WireGuard, charon's kernel-libipsec for XFRM ESP) read the tunnel's datagrams from a UDP
socket whose buffer is this host's default; the board's kernel never puts those datagrams in a
socket buffer but in the data plane's own queue (lab.model.boardkernel, `queue`). The lab
sizes the stand-in's socket to that queue without the daemon's help: pidfd_getfd(2) (Linux
5.6) gives the lab a duplicate of the daemon's socket descriptor (the same socket), on which
SO_RCVBUFFORCE (root) sets the buffer; the daemon's own descriptor sees the new size at once.

Which descriptor: the process's fds that are sockets (/proc/PID/fd -> socket:[INODE]) whose
inode is a UDP socket bound to the port asked for, in the process's own network namespace
(/proc/PID/net/udp and udp6, which list that namespace's sockets).
"""

from __future__ import annotations

import ctypes
import os
import socket
from dataclasses import dataclass
from pathlib import Path

#: pidfd_getfd's number: the same on every architecture (new syscalls share one table since 424)
SYS_PIDFD_GETFD = 438
#: <asm-generic/socket.h>: set SO_RCVBUF beyond net.core.rmem_max (CAP_NET_ADMIN)
SO_RCVBUFFORCE = 33

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class SocketBuffer:
    pid: int
    fd: int
    port: int
    before: int  # SO_RCVBUF as the kernel reports it (the accounting limit, bytes)
    after: int


def udp_inodes(pid: int, port: int | None = None, proc: Path = Path("/proc")) -> dict[int, int]:
    """{inode: local port} of the UDP sockets in `pid`'s network namespace (those bound to
    `port` only, when given)."""
    found = {}
    for table in ("udp", "udp6"):
        try:
            lines = (proc / str(pid) / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            # sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
            if len(f) > 9:
                local = int(f[1].rsplit(":", 1)[1], 16)
                if port is None or local == port:
                    found[int(f[9])] = local
    return found


def socket_fds(pid: int, inodes: dict[int, int], proc: Path = Path("/proc")) -> dict[int, int]:
    """{descriptor: the value of its socket's inode in `inodes`} of `pid`'s sockets among
    `inodes`."""
    out = {}
    try:
        entries = list((proc / str(pid) / "fd").iterdir())
    except OSError:
        return out
    for e in entries:
        try:
            target = os.readlink(e)
        except OSError:
            continue
        if target.startswith("socket:[") and int(target[8:-1]) in inodes:
            out[int(e.name)] = inodes[int(target[8:-1])]
    return dict(sorted(out.items()))


def _getfd(pid: int, fd: int) -> int:
    pidfd = os.pidfd_open(pid)
    try:
        dup = _libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
        if dup < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"pidfd_getfd({pid}, {fd}): {os.strerror(err)}")
        return dup
    finally:
        os.close(pidfd)


def set_receive_buffer(pid: int, port: int | None, nbytes: int) -> list[SocketBuffer]:
    """Give every UDP socket of `pid` bound to `port` (None: every one) a receive buffer of
    `nbytes` (the accounting limit the kernel reports back; SO_RCVBUFFORCE doubles what it is
    given, so it is given half). Returns what changed; [] when the process has no such socket. Raises
    OSError when a descriptor cannot be taken or set (no permission, no pidfd_getfd)."""
    out = []
    for fd, local in socket_fds(pid, udp_inodes(pid, port)).items():
        s = socket.socket(fileno=_getfd(pid, fd))
        try:
            before = s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, max(1, nbytes // 2))
            after = s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        finally:
            s.close()  # our duplicate only: the daemon's descriptor stays open
        out.append(SocketBuffer(pid, fd, local, before, after))
    return out
