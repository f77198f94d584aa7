"""Where a lab runs: this machine's namespaces (local/), the full-kernel VM (vm/) and boards over SSH (boards/), behind one interface (base.py) and one registry (registry.py)."""
