"""The full-kernel VM substrate: a stock Debian kernel under QEMU, the host root as its root.

For hosts whose kernel lacks what the lab needs (netem, WireGuard, ESP, MACsec, GRE, ...). See
docs/vm.md. Public API:

    probe_accel() -> "kvm" | "tcg"
    boot(state_dir, *, mem_mb, cpus, shares, project_dir, runs_dir, ...) -> VM
    VM.run(argv, ...) -> CompletedProcess, VM.shutdown(), VM.attach(state_dir), VM.pid, ...
    find_kernel() -> Kernel
"""

from __future__ import annotations

from lab.substrate.vm.kernel import Kernel, cache_dir, find_kernel
from lab.substrate.vm.booting import boot
from lab.substrate.vm.machine import VM
from lab.substrate.vm.qemu import probe_accel

__all__ = ["VM", "Kernel", "boot", "cache_dir", "find_kernel", "probe_accel"]
