"""lab: a network-namespace emulation lab for benchmarking VPNs."""

from pathlib import Path

__version__ = "0.1.0"

#: the package's directory, and the checkout it sits in (vpn_profiles/, cpu_profiles/, engine/,
#: tools/ beside it): the one place a module finds the project's files
PACKAGE_DIR = Path(__file__).resolve().parent
REPO = PACKAGE_DIR.parent
