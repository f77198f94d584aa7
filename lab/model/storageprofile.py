"""A board profile's storage ([storage] table): the card a board writes its files to, and how
much of a write the board's kernel lets sit in its page cache before the writer waits for it.

Pure data and arithmetic. The card is one figure, its sustained sequential write rate (and,
optionally, its read rate), each with its source. The page cache is the board kernel's dirty
page limits: vm.dirty_ratio and vm.dirty_background_ratio of the memory that kernel counts as
dirtyable (free + file pages; on a 32-bit kernel with highmem only the low memory, since
vm.highmem_is_dirtyable is 0 by default). A writer runs at its own speed until the dirty pages
reach the free-run ceiling, halfway between the two limits, and at about the card's rate after
that (mm/page-writeback.c, balance_dirty_pages). lab.substrate.local.storage builds it; docs/cpu.md
"Storage" has the figures and what was measured.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from lab.core.errors import ConfigError, reject_unknown

MIB = 1024 * 1024
#: a file at the root of a node's storage that says it is a board's card (the model, as JSON):
#: a test finds its directory is one by it (lab.measure.scp), on any substrate
STORAGE_MARKER = ".lab-storage.json"
#: accepted fields of [storage]
STORAGE_FIELDS = (
    "card",
    "write_mbps",
    "read_mbps",
    "source",
    "derivation",
    "ram_mib",
    "dirtyable_mib",
    "dirty_ratio",
    "dirty_background_ratio",
    "dirty_source",
    "dirty_derivation",
    "image_mib",
)
_REQUIRED = (
    "card",
    "write_mbps",
    "source",
    "derivation",
    "dirtyable_mib",
    "dirty_source",
    "dirty_derivation",
)
#: a card's rate in MB/s (10^6 bytes/s): above 0, at most this (no SD card reaches it)
RATE_MAX_MBPS = 10_000.0
#: the node's file system image (sparse on this machine): room for a test's files
IMAGE_MIB_DEFAULT = 4096
IMAGE_MIB_RANGE = (64, 1 << 20)


@dataclass(frozen=True)
class StorageModel:
    """The board's storage as a profile states it (MB = 10^6 bytes, MiB = 2^20 bytes)."""

    card: str
    write_mbps: float
    source: str
    derivation: str
    dirtyable_mib: float
    dirty_source: str
    dirty_derivation: str
    read_mbps: float | None = None
    ram_mib: int | None = None
    dirty_ratio: int = 20
    dirty_background_ratio: int = 10
    image_mib: int = IMAGE_MIB_DEFAULT

    @property
    def write_bps(self) -> int:
        """The card's write rate in bytes/s (the block-layer limit the lab sets)."""
        return int(round(self.write_mbps * 1e6))

    @property
    def read_bps(self) -> int | None:
        return None if self.read_mbps is None else int(round(self.read_mbps * 1e6))

    @property
    def dirty_limit_bytes(self) -> int:
        """vm.dirty_ratio of the dirtyable memory: no writer dirties more than this."""
        return int(self.dirtyable_mib * MIB * self.dirty_ratio / 100)

    @property
    def dirty_background_bytes(self) -> int:
        """Where the board's flusher starts writing back in the background."""
        return int(self.dirtyable_mib * MIB * self.dirty_background_ratio / 100)

    @property
    def freerun_bytes(self) -> int:
        """Below this many dirty bytes a writer is never throttled (dirty_freerun_ceiling)."""
        return (self.dirty_limit_bytes + self.dirty_background_bytes) // 2

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            write_bps=self.write_bps,
            read_bps=self.read_bps,
            dirty_limit_bytes=self.dirty_limit_bytes,
            dirty_background_bytes=self.dirty_background_bytes,
            freerun_bytes=self.freerun_bytes,
        )
        return d


def board_write_seconds(model: StorageModel, size: int, arrival_bps: float) -> float:
    """What the board's kernel makes of writing `size` bytes arriving at `arrival_bps` (bytes/s,
    e.g. scp's network rate) when nothing else is dirty: the writer runs at the arrival rate,
    background writeback drains at the card's rate from the background limit on, and once the
    dirty pages reach the free-run ceiling the writer goes at the card's rate. Returns when the
    writer is done (close(), no fsync: the rest is still dirty then). A first-order model of
    balance_dirty_pages, for docs/cpu.md's comparison; the lab runs the kernel's own."""
    w, r = float(model.write_bps), float(arrival_bps)
    bg, free = model.dirty_background_bytes, model.freerun_bytes
    if size <= bg or r <= w:
        return size / r
    # dirty pages grow at r up to bg, then at r - w until the free-run ceiling
    at_free = bg + (free - bg) * r / (r - w)
    if size <= at_free:
        return size / r
    return at_free / r + (size - at_free) / w


def parse_storage(table: Any, src: str) -> StorageModel | None:
    """The [storage] table of profile file `src` (None when absent). Errors name the file, the
    field and what is accepted; a figure without its source is refused."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(
            f"must be a table with {', '.join(STORAGE_FIELDS)}", source=src, field="storage"
        )
    reject_unknown(table, STORAGE_FIELDS, source=src, where="storage")
    for f in _REQUIRED:
        if f not in table or table[f] in ("", None):
            raise ConfigError(
                f"missing (required: {', '.join(_REQUIRED)}): say what the figure is, where it "
                "comes from and how it was derived",
                source=src,
                field=f"storage.{f}",
            )
    for f in ("card", "source", "derivation", "dirty_source", "dirty_derivation"):
        if not isinstance(table[f], str):
            raise ConfigError(
                f"must be a string, got {table[f]!r}", source=src, field=f"storage.{f}"
            )

    def rate(f: str) -> float | None:
        v = table.get(f)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= RATE_MAX_MBPS:
            raise ConfigError(
                f"got {v!r}; accepted: MB/s (10^6 bytes/s) above 0 and at most {RATE_MAX_MBPS:g}",
                source=src,
                field=f"storage.{f}",
            )
        return float(v)

    def integer(f: str, lo: int, hi: int, default: int | None) -> int | None:
        v = table.get(f, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ConfigError(
                f"got {v!r}; accepted: an integer from {lo} to {hi}",
                source=src,
                field=f"storage.{f}",
            )
        return v

    dirtyable = table["dirtyable_mib"]
    if isinstance(dirtyable, bool) or not isinstance(dirtyable, int | float) or dirtyable <= 0:
        raise ConfigError(
            f"got {dirtyable!r}; accepted: MiB above 0", source=src, field="storage.dirtyable_mib"
        )
    ram = integer("ram_mib", 1, 1 << 24, None)
    if ram is not None and dirtyable > ram:
        raise ConfigError(
            f"{dirtyable} MiB is more than the board's RAM (ram_mib = {ram})",
            source=src,
            field="storage.dirtyable_mib",
        )
    ratio = integer("dirty_ratio", 1, 100, 20)
    bg = integer("dirty_background_ratio", 0, 100, 10)
    if bg >= ratio:
        # the kernel halves the background ratio then (domain_dirty_limits); say it instead
        raise ConfigError(
            f"got {bg}; accepted: below dirty_ratio ({ratio})",
            source=src,
            field="storage.dirty_background_ratio",
        )
    lo, hi = IMAGE_MIB_RANGE
    return StorageModel(
        card=table["card"],
        write_mbps=rate("write_mbps"),
        read_mbps=rate("read_mbps"),
        source=table["source"],
        derivation=table["derivation"],
        ram_mib=ram,
        dirtyable_mib=float(dirtyable),
        dirty_ratio=ratio,
        dirty_background_ratio=bg,
        dirty_source=table["dirty_source"],
        dirty_derivation=table["dirty_derivation"],
        image_mib=integer("image_mib", lo, hi, IMAGE_MIB_DEFAULT),
    )
