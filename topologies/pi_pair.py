"""Two Raspberry Pi 4 boards joined by one 1 Gbit/s cable (study A's bench, no middlebox).

    client (pi4) ---- 1 Gbit/s ---- server (pi4)

Impairment with this topology goes on the endpoints' egress (study A style) or, with the
userspace engine, into a hidden bump-in-the-wire namespace on the link.
"""

from mininet.topo import Topo


class PiPair(Topo):
    def build(self, cpu="pi4", bw=1000):
        client = self.addHost("client", cpu=cpu, ip="10.0.1.1/24", ip6="fd00:1::1/64", vpn="client")
        server = self.addHost("server", cpu=cpu, ip="10.0.1.2/24", ip6="fd00:1::2/64", vpn="server")
        self.addLink(client, server, bw=bw)


topos = {"pi_pair": PiPair}
