"""lab.measure.tcpstream.socket_reader: a test's TCP socket read with ss on a node once a second
(scp's streaming stop reads the receiving sshd's bytes_received and the sending ssh's state with
it). On recorded `ss -tinH` output (tests/data/README) replayed by a node, and on this machine's
own loopback with a real ss."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from lab.core.errors import CommandError
from lab.core.hostnode import HostNode
from lab.measure.tcpsender import SenderState, sender_argv, sender_state, tcp_timeouts
from lab.measure.tcpstream import bytes_received, socket_reader, ss_argv
from tests.fakenode import RecordingNode

DATA = Path(__file__).parent / "data"
#: two readings, a second apart, of the receiving socket of a TCP connection to port 2222
RECEIVER = [(DATA / f"ss_tinH_tcp2222_receiver_{i}.txt").read_text() for i in (1, 2)]
#: the sending end's socket and its namespace's /proc/net/netstat (tcpsender.sender_argv)
SENDER = (DATA / "ss_tinH_tcp2222_sender_netstat.txt").read_text()


def _replay(outputs: list[str]) -> RecordingNode:
    """A node answering each command with the next recorded output, exit status 0."""
    left = list(outputs)
    return RecordingNode({(): lambda argv: (0, left.pop(0), "")})


def test_the_receiving_sockets_bytes_are_read_each_time_it_is_called():
    node = _replay(RECEIVER)
    read = socket_reader(node, ss_argv(2222, local=True), bytes_received)
    assert [read(), read()] == [11146752, 54572544]
    assert node.calls == [ss_argv(2222, local=True)] * 2


def test_the_sending_sockets_text_carries_its_state_and_the_namespaces_timeouts():
    argv = sender_argv(ss_argv(2222, local=False))
    node = _replay([SENDER])
    text = socket_reader(node, argv, lambda t: t)()
    assert node.calls == [argv]
    assert sender_state(text) == SenderState("cubic", 10, None, busy_ms=776, limited_ms=776)
    assert tcp_timeouts(text) == 0


def test_a_reading_that_fails_parses_as_no_output():
    # ss's own refusal (exit 1, as iproute2 6.1 prints it), a command that cannot run at all
    refused = RecordingNode({("ss",): (1, "", 'Error: "bogus" does not look like a port.\n')})
    assert socket_reader(refused, ss_argv(2222, local=True), bytes_received)() is None
    # a non-zero exit discards what was printed: no partial listing becomes a reading
    partial = RecordingNode({("ss",): (1, RECEIVER[0], "netlink error")})
    assert socket_reader(partial, ss_argv(2222, local=True), bytes_received)() is None

    def lost(argv):
        raise CommandError(argv, 255, "Connection closed by 192.0.2.7", where="node pi")

    gone = RecordingNode({(): lost})
    assert socket_reader(gone, ss_argv(2222, local=True), bytes_received)() is None
    assert socket_reader(gone, sender_argv(ss_argv(2222, local=False)), lambda t: t)() == ""


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_a_real_sockets_bytes_on_this_machines_loopback():
    payload = b"x" * 300_000
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as cli:
            con, _ = srv.accept()
            with con:
                cli.sendall(payload)
                got = 0
                while got < len(payload):
                    got += len(con.recv(65536))
                read = socket_reader(HostNode(), ss_argv(port, local=True), bytes_received)
                # the accepted socket is the only established one whose local port is the
                # listener's: exactly the bytes it received
                assert read() == len(payload)
                cli.sendall(payload[:1000])
                while got < len(payload) + 1000:
                    got += len(con.recv(65536))
                assert read() == len(payload) + 1000
