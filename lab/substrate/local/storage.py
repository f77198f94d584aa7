"""The board's storage in a lab on this machine: each node whose board profile has a [storage]
table gets a file system of its own where its files go, held to the board's card rate and
dirty-page limits (lab.model.storageprofile says what, lab.core.blockdev how).

Where a node's files go: the lab's measurement scratch directory (`<lab dir>/measure`, the
runner's Context.state_dir, where the scp test keeps its keys, its payload and, with its
default `dest`, the file it receives). The node's file system is mounted there inside the
node's mount namespace only; every other node and this machine see their own. Its root holds
STORAGE_MARKER (the model as JSON), by which a test knows the directory is a board's card. (Not
an environment variable: a node's environment goes on to an emulated board farm's sshd,
lab/substrate/boards/farm.py, whose boards have their own /var/lib/lab.)

`storage_plan` decides before anything is created (LocalBuild.check) and records it in the
node's cpu record (lab.json, `lab status --json`, the run manifest's cpu.<node>.storage):
the model, its rates and sources, and which mechanism runs, or why none does. `build_storage`
creates the objects, each recorded in the ledger first.
"""

from __future__ import annotations

import json
from pathlib import Path

from lab.core import blockdev
from lab.core.state import Ledger, lab_dir, write_json_atomic
from lab.model.cpuprofile import load_cpu_profile
from lab.model.labspec import LabSpec
from lab.model.storageprofile import STORAGE_MARKER
from lab.substrate.local.cpuplan import doc_ref

#: the runner's Context.state_dir, relative to the lab's directory (lab/campaign/runner.py)
MEASURE_DIR = "measure"


def storage_plan(spec: LabSpec, cpu: dict[str, dict], lab_id: str) -> list[str]:
    """Add `storage` to the cpu plan of every host node whose profile states its storage;
    returns warnings. Nothing is created."""
    models = {}
    for n in spec.hosts():
        plan = cpu.get(n.name) or {}
        if plan.get("profile"):
            model = load_cpu_profile(plan["profile"], merge_calibration=False).storage
            if model is not None:
                models[n.name] = model
    if not models:
        return []
    mechanism, why = blockdev.probe()
    target = str(lab_dir(lab_id) / MEASURE_DIR)
    for name, model in models.items():
        rec = {"model": model.to_json(), "mount": target, "mechanism": mechanism or "none"}
        if mechanism is None:
            rec["why_none"] = why
        cpu[name]["storage"] = rec
    if mechanism is None:
        return [
            f"board storage not modelled on {', '.join(models)}: {why}; their files go to this "
            "machine's disk at its speed (docs/cpu.md, Storage)"
        ]
    return []


def build_storage(lab_id: str, info: dict, ledger: Ledger) -> None:
    """Create, for each node with a storage plan, its image, loop device, rate limits and mount
    (after its mount namespace exists). Each object is recorded before it is created; a failure
    leaves what was recorded to the caller's unwind (lab.core.teardown)."""
    d = lab_dir(lab_id)
    built = False
    for name, rt in info["nodes"].items():
        rec = (rt.get("cpu") or {}).get("storage")
        if not rec or rec["mechanism"] == "none" or not rt.get("mntns"):
            continue
        model = rec["model"]
        (d / "storage").mkdir(mode=0o700, exist_ok=True)
        Path(rec["mount"]).mkdir(mode=0o700, exist_ok=True)
        image = d / "storage" / f"{name}.img"
        ledger.record("storage-image", node=name, path=str(image))
        marker = {"node": name, "mechanism": rec["mechanism"], "model": model}
        blockdev.create_image(image, model["image_mib"], {STORAGE_MARKER: json.dumps(marker)})
        ledger.record("storage-loop", node=name, image=str(image))
        dev = blockdev.attach(image)
        devt = blockdev.dev_t(dev)
        ledger.record(
            "storage-mount", node=name, mntns=rt["mntns"], target=rec["mount"], image=str(image)
        )
        blockdev.mount_in(Path(rt["mntns"]), dev, rec["mount"])
        # the limits last, so teardown lifts them first: the unmount's final flush then goes
        # at this machine's speed, not the card's
        groups = blockdev.blkio_groups()
        ledger.record("storage-limits", node=name, image=str(image), dev=devt, groups=groups)
        blockdev.set_rate(devt, model["write_bps"], model["read_bps"], groups)
        rec["dirty_limit"] = blockdev.set_dirty_limit(devt, model["dirty_limit_bytes"])
        if "not_applied" in rec["dirty_limit"]:
            info["warnings"].append(
                f"node {name}: the board's dirty-page limit is not applied "
                f"({rec['dirty_limit']['not_applied']}): its writes wait for the card only "
                f"beyond this machine's own limits {doc_ref('dirty-page-limit')}"
            )
        rec.update(
            image=str(image),
            loop=dev,
            dev=devt,
            blkio_groups=groups,
            rates_set=blockdev.rates(devt),
        )
        built = True
    if built:
        write_json_atomic(d / "lab.json", info)
