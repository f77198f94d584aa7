"""Study C: host -- gateway -- gateway -- host; the tunnel runs between the two gateways.

    h1 -- 10.1.0.0/24 -- gw1 (pi4) -- 10.0.0.0/24 (WAN) -- gw2 (pi4) -- 10.2.0.0/24 -- h2

Traffic runs host to host through the gateways' tunnel. The WAN link is where impairment goes.
"""

from mininet.topo import Topo


class SiteToSite(Topo):
    def build(self, cpu="pi4", bw=1000):
        h1 = self.addHost("h1", traffic="client", defaultRoute="via 10.1.0.1")
        gw1 = self.addHost("gw1", cpu=cpu, router=True, vpn="client")
        gw2 = self.addHost("gw2", cpu=cpu, router=True, vpn="server")
        h2 = self.addHost("h2", traffic="server", defaultRoute="via 10.2.0.1")
        self.addLink(h1, gw1, bw=bw,
                     params1={"ip": "10.1.0.2/24", "ip6": "fd00:a1::2/64"},
                     params2={"ip": "10.1.0.1/24", "ip6": "fd00:a1::1/64"})
        self.addLink(gw1, gw2, bw=bw,
                     params1={"ip": "10.0.0.1/24", "ip6": "fd00:a0::1/64"},
                     params2={"ip": "10.0.0.2/24", "ip6": "fd00:a0::2/64"})
        self.addLink(gw2, h2, bw=bw,
                     params1={"ip": "10.2.0.1/24", "ip6": "fd00:a2::1/64"},
                     params2={"ip": "10.2.0.2/24", "ip6": "fd00:a2::2/64"})


topos = {"site_to_site": SiteToSite}
