"""One module per VPN technology: each defines a lab.vpn.base.Driver subclass, discovered by lab.vpn.driver_classes()."""
