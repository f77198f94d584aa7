"""Two Pi 4 boards with a router between them that impairs traffic (study A's recommendation).

    client (pi4) -- 10.0.1.0/24 -- router -- 10.0.2.0/24 -- server (pi4)

The router forwards IPv4 and IPv6 and is uncapped: it stands for a separate, faster box, so the
impairment it applies never competes with the boards for CPU.
"""

from mininet.topo import Topo


class PiPairMiddlebox(Topo):
    def build(self, cpu="pi4", router_cpu=None, bw=1000):
        client = self.addHost("client", cpu=cpu, vpn="client",
                              defaultRoute="via 10.0.1.1")
        server = self.addHost("server", cpu=cpu, vpn="server",
                              defaultRoute="via 10.0.2.1")
        router_opts = {"router": True}
        if router_cpu is not None:
            router_opts["cpu"] = router_cpu
        router = self.addHost("router", **router_opts)
        self.addLink(client, router, bw=bw,
                     params1={"ip": "10.0.1.2/24", "ip6": "fd00:1::2/64"},
                     params2={"ip": "10.0.1.1/24", "ip6": "fd00:1::1/64"})
        self.addLink(router, server, bw=bw,
                     params1={"ip": "10.0.2.1/24", "ip6": "fd00:2::1/64"},
                     params2={"ip": "10.0.2.2/24", "ip6": "fd00:2::2/64"})


topos = {"pi_pair_middlebox": PiPairMiddlebox}
