"""lab: a network-namespace emulation lab for benchmarking VPNs."""

__version__ = "0.1.0"
