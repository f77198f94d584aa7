"""The userspace WireGuard daemon's UAPI socket at start-up (lab/vpn/drivers/wireguard.py).

`wg` deletes a socket file whose connect() is refused, and a connect() is refused between the
daemon's bind() and listen(): the driver's readiness poll (`wg show wg0 listen-port`) could so
delete wireguard-go's fresh socket, which then exited with "Failed to listen on uapi socket: no
such file or directory" (intermittent, more often on a host busy with another lab). The driver
now asks `wg` only once the node's /proc/net/unix shows the socket listening.

Unit: the /proc/net/unix reading, and the order of the poll's commands on a recorded node.
Root: a daemon stand-in that binds, waits, then listens and answers the UAPI in a private mount
and network namespace; the driver's wait must leave its socket in place.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from lab.core import proc
from lab.core.errors import StartupError
from lab.vpn.drivers.wireguard import IFNAME, WireGuardDriver, uapi_listening
from tests.fakenode import RecordingNode

HEADER = "Num       RefCount Protocol Flags    Type St Inode Path\n"
BOUND = "00000000bcf81e18: 00000002 00000000 00000000 0001 01 3288827 /var/run/wireguard/wg0.sock\n"
LISTENING = (
    "00000000bcf81e18: 00000002 00000000 00010000 0001 01 3288827 /var/run/wireguard/wg0.sock\n"
)
OTHER = "00000000bcf81e19: 00000002 00000000 00010000 0001 01 3288828 /run/wireguard/wg1.sock\n"


def test_uapi_listening_needs_the_interfaces_socket_with_the_listening_flag():
    assert not uapi_listening(HEADER, IFNAME)
    assert not uapi_listening(HEADER + BOUND, IFNAME)  # bound, not listening: refused
    assert uapi_listening(HEADER + BOUND.replace("00000000 0001", "00010000 0001"), IFNAME)
    assert uapi_listening(HEADER + OTHER + LISTENING, IFNAME)
    assert not uapi_listening(HEADER + OTHER, IFNAME)  # another interface's
    assert uapi_listening(HEADER + OTHER, "wg1")  # the /run spelling of the same directory
    boringtun = LISTENING.replace("wireguard/wg0", "wireguard//wg0")  # as boringtun binds it
    assert uapi_listening(HEADER + boringtun, IFNAME)


class _Daemon:
    name = "wireguard-go"

    def alive(self) -> bool:
        return True

    def log_tail(self, lines: int = 15) -> str:
        return ""


def test_wg_is_asked_only_once_the_socket_listens():
    """The old poll ran `wg show` at once; here /proc/net/unix says 'bound' twice first."""
    states = iter([BOUND, BOUND, LISTENING])
    node = RecordingNode(
        {
            ("cat", "/proc/net/unix"): lambda argv: (0, HEADER + next(states), ""),
            ("wg", "show"): (0, "51820\n", ""),
        }
    )
    end = SimpleNamespace(node=node, name="server")
    WireGuardDriver._wait_uapi(None, end, _Daemon())
    assert node.commands() == ["cat", "cat", "cat", "wg"]


def test_a_socket_that_never_listens_is_not_ready_and_wg_is_never_asked():
    node = RecordingNode({("cat", "/proc/net/unix"): (0, HEADER + BOUND, "")})
    end = SimpleNamespace(node=node, name="server")
    with pytest.raises(StartupError, match="not ready during start-up"):
        WireGuardDriver._wait_uapi(None, end, _Daemon(), timeout=0.05)
    assert set(node.commands()) == {"cat"}


# ------------------------------------------------------------------------------------ root

#: a wireguard-go stand-in: bind, hold the socket unlistened (the window), listen, answer one
#: `wg show` as the UAPI does, then say whether its socket file is still there
STANDIN = textwrap.dedent(
    """
    import os, socket, sys, time
    path = "/var/run/wireguard/wg0.sock"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    print("bound", flush=True)
    time.sleep(float(sys.argv[1]))
    s.listen(4)
    while True:  # wg may connect once only to see that the interface exists
        c, _ = s.accept()
        if b"get=1" in c.recv(4096):
            c.sendall(b"listen_port=51820\\nerrno=0\\n\\n")
            c.close()
            break
        c.close()
    print("kept" if os.path.exists(path) else "deleted", flush=True)
    time.sleep(30)
    """
)


class _NsNode:
    """Commands run in the stand-in's mount and network namespaces (as a lab node's would)."""

    name = "standin"

    def __init__(self, pid: int):
        self.pre = ["nsenter", f"--mount=/proc/{pid}/ns/mnt", f"--net=/proc/{pid}/ns/net", "--"]

    def run(self, argv, *, check=True, timeout=60):
        return subprocess.run(
            [*self.pre, *argv], capture_output=True, text=True, timeout=timeout, check=check
        )


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (unshare --mount --net)")
@pytest.mark.skipif(
    not all(proc.which(t) for t in ("wg", "unshare", "nsenter")),
    reason="needs wg, unshare and nsenter (./setup.sh)",
)
def test_the_wait_leaves_a_socket_between_bind_and_listen_in_place(tmp_path):
    standin = tmp_path / "standin.py"
    standin.write_text(STANDIN)
    script = f"mount -t tmpfs lab-run /run && exec {sys.executable} {standin} 0.5"
    p = subprocess.Popen(
        ["unshare", "--mount", "--net", "--propagation", "private", "--", "sh", "-c", script],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "bound"  # its socket exists, unlistened
        daemon = SimpleNamespace(
            name="standin", alive=lambda: p.poll() is None, log_tail=lambda lines=15: ""
        )
        end = SimpleNamespace(node=_NsNode(p.pid), name="standin")
        WireGuardDriver._wait_uapi(None, end, daemon, timeout=5)
        assert p.stdout.readline().strip() == "kept"
    finally:
        p.kill()
        p.wait()
