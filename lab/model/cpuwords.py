"""The words for CPU figures, one vocabulary for `lab status`, the run report and its plots:
a figure is in **board cores** (cores of the node's CPU profile, each as fast as one core of
the board) or in **host cores** (cores of this machine), and says which; a capped node's
capacity reads "pi4: 4 board cores = 0.90 host cores" (docs/cpu.md "Board cores and host
cores"). Pure functions of a node's `cpu` record (lab.json, `lab status --json`, a run
manifest's `cpu`)."""

from __future__ import annotations


def host_cores_per_board_core(cpu: dict | None) -> float | None:
    """Host cores one board core of the node's CPU profile is worth (its calibrated or assumed
    core_share); None for an uncapped node or a cap that was not applied (docs/cpu.md)."""
    cpu = cpu or {}
    if not cpu.get("profile") or cpu.get("not_applied"):
        return None
    if cpu.get("core_share"):
        # a time-dilated lab emulates one board core with core_share / dilation host cores
        return float(cpu["core_share"]) / float(cpu.get("dilation") or 1.0)
    if cpu.get("cores") and cpu.get("emulated_cores"):
        return float(cpu["cores"]) / float(cpu["emulated_cores"])
    return None


def board_cores(pct_of_host_core: float | None, cpu: dict | None) -> float | None:
    """A node's CPU in % of one host core -> board cores of its profile (None if uncapped)."""
    share = host_cores_per_board_core(cpu)
    if pct_of_host_core is None or not share:
        return None
    return pct_of_host_core / 100 / share


def node_board_cores(cpu: dict | None) -> float | None:
    """The board cores a capped node really has: its profile's, fewer where the lab scaled
    the profiles to fit this machine (`board_cores_emulated`); None if uncapped."""
    cpu = cpu or {}
    share = host_cores_per_board_core(cpu)
    if not share:
        return None
    if cpu.get("board_cores_emulated"):
        return float(cpu["board_cores_emulated"])
    if cpu.get("cores"):
        return float(cpu["cores"]) / share
    return float(cpu["emulated_cores"]) if cpu.get("emulated_cores") else None


def board_cores_words(n: float) -> str:
    return f"{n:.3g} board core" + ("" if n == 1 else "s")


def host_cores_words(n: float, of: int | None = None) -> str:
    """'0.90 host cores'; with `of`, the machine's total: '0.32 of 32 host cores'."""
    return f"{n:.2f}" + (f" of {of}" if of else "") + " host cores"


def capacity_words(cpu: dict | None) -> str:
    """What a node may use: 'pi4: 4 board cores = 0.90 host cores' for a capped node ('pi4:
    3.56 of 4 board cores = ...' where the profiles were scaled to fit this machine), '0.50 host
    cores' for a fixed fraction, 'pi4: no cap (TCG)' where the cap is not applied, '-' uncapped."""
    cpu = cpu or {}
    profile, quota = cpu.get("profile"), cpu.get("cores")
    if not profile:
        return host_cores_words(float(quota)) if quota else "-"
    have = node_board_cores(cpu)
    if have is None or not quota:
        why = cpu.get("not_applied")
        return f"{profile}: no cap" + (f" ({why})" if why else "")
    total = cpu.get("board_cores")
    cores = (
        f"{have:.3g} of {board_cores_words(float(total))}"
        if total and round(have, 3) < float(total)
        else board_cores_words(have)
    )
    return f"{profile}: {cores} = {host_cores_words(float(quota))}"


def usage_words(pct_of_host_core: float | None, cpu: dict | None) -> str:
    """A node's measured CPU: '1.62 of 3.56 board cores = 0.41 host cores' for a capped node
    (1.00 of 1 = its cap is saturated), '0.41 host cores' for an uncapped one, '-' unmeasured."""
    if pct_of_host_core is None:
        return "-"
    used, have = board_cores(pct_of_host_core, cpu), node_board_cores(cpu)
    host = host_cores_words(pct_of_host_core / 100)
    if used is None:
        return host
    of = f" of {have:.3g}" if have else ""
    return f"{used:.2f}{of} board core{'' if have == 1 else 's'} = {host}"
