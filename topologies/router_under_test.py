"""Study B: LAN client -- router under test (VPN endpoint) -- WAN host acting as VPN server.

    lan (traffic client) -- 192.168.1.0/24 -- router (pi4, VPN client) -- 10.0.0.0/24 -- wan (VPN server)

Traffic generators never run on the router: the LAN host sends through it and the tunnel it
terminates. The router is the capped board; the two hosts are uncapped.
"""

from mininet.topo import Topo


class RouterUnderTest(Topo):
    def build(self, cpu="pi4", bw=1000):
        lan = self.addHost("lan", traffic="client", defaultRoute="via 192.168.1.1")
        router = self.addHost("router", cpu=cpu, router=True, vpn="client")
        wan = self.addHost("wan", vpn="server", traffic="server")
        self.addLink(lan, router, bw=bw,
                     params1={"ip": "192.168.1.2/24", "ip6": "fd00:192::2/64"},
                     params2={"ip": "192.168.1.1/24", "ip6": "fd00:192::1/64"})
        self.addLink(router, wan, bw=bw,
                     params1={"ip": "10.0.0.1/24", "ip6": "fd00:10::1/64"},
                     params2={"ip": "10.0.0.2/24", "ip6": "fd00:10::2/64"})


topos = {"router_under_test": RouterUnderTest}
