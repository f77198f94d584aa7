"""Study C's second network: two hosts with two routers between them.

    client (pi4) -- 10.0.1.0/24 -- r1 -- 10.0.12.0/24 -- r2 -- 10.0.2.0/24 -- server (pi4)

The VPN endpoints are the traffic endpoints: the two hosts (what IPsec transport mode needs:
it protects only packets the endpoints themselves send and receive). The routers forward IPv4
and IPv6 and are uncapped: they stand for separate boxes. Study C's first network, the two
hosts back to back, is topologies/pi_pair.py.
"""

from mininet.topo import Topo


class HostRouterRouterHost(Topo):
    def build(self, cpu="pi4", router_cpu=None, bw=1000):
        client = self.addHost("client", cpu=cpu, vpn="client", traffic="client",
                              defaultRoute="via 10.0.1.1")
        server = self.addHost("server", cpu=cpu, vpn="server", traffic="server",
                              defaultRoute="via 10.0.2.1")
        router_opts = {"router": True}
        if router_cpu is not None:
            router_opts["cpu"] = router_cpu
        r1 = self.addHost("r1", **router_opts)
        r2 = self.addHost("r2", **router_opts)
        self.addLink(client, r1, bw=bw,
                     params1={"ip": "10.0.1.2/24", "ip6": "fd00:1::2/64"},
                     params2={"ip": "10.0.1.1/24", "ip6": "fd00:1::1/64"})
        self.addLink(r1, r2, bw=bw,
                     params1={"ip": "10.0.12.1/24", "ip6": "fd00:12::1/64"},
                     params2={"ip": "10.0.12.2/24", "ip6": "fd00:12::2/64"})
        self.addLink(r2, server, bw=bw,
                     params1={"ip": "10.0.2.1/24", "ip6": "fd00:2::1/64"},
                     params2={"ip": "10.0.2.2/24", "ip6": "fd00:2::2/64"})


topos = {"host_router_router_host": HostRouterRouterHost}
