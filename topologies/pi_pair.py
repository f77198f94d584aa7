"""Two Raspberry Pi 4 boards joined by one 1 Gbit/s cable (study A's bench, no middlebox).

    client (pi4) ---- 1 Gbit/s ---- server (pi4)

`-p client_arch=arm64` (or server_arch, armhf) runs that board's own Debian binaries under
qemu-user (docs/arch.md).

Impairment with this topology goes on the endpoints' egress (study A style) or, with the
userspace engine, into a hidden bump-in-the-wire namespace on the link.
"""

from mininet.topo import Topo


class PiPair(Topo):
    def build(self, cpu="pi4", bw=1000, client_arch=None, server_arch=None):
        client = self.addHost(
            "client", cpu=cpu, ip="10.0.1.1/24", ip6="fd00:1::1/64", vpn="client", arch=client_arch
        )
        server = self.addHost(
            "server", cpu=cpu, ip="10.0.1.2/24", ip6="fd00:1::2/64", vpn="server", arch=server_arch
        )
        self.addLink(client, server, bw=bw)


topos = {"pi_pair": PiPair}
