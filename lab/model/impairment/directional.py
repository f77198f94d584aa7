"""Direction-aware specs: `a2b: WORDS; b2a: WORDS` -> DirectionalImpairment."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lab.core.errors import ConfigError
from lab.model.impairment.model import Impairment, parse_spec


DIRECTIONS = ("a2b", "b2a")


@dataclass(frozen=True)
class DirectionalImpairment:
    """The two directions of a link: a2b is what node a sends towards b (a = the first node of
    addLink(a, b)). Symmetric unless the spec says otherwise."""

    a2b: Impairment = dataclasses.field(default_factory=Impairment)
    b2a: Impairment = dataclasses.field(default_factory=Impairment)

    @classmethod
    def symmetric(cls, imp: Impairment) -> DirectionalImpairment:
        return cls(imp, imp)

    def is_symmetric(self) -> bool:
        return self.a2b == self.b2a

    def is_empty(self) -> bool:
        return self.a2b.is_empty() and self.b2a.is_empty()

    def direction(self, name: str) -> Impairment:
        if name not in DIRECTIONS:
            raise ConfigError(f"direction must be one of {', '.join(DIRECTIONS)}, got {name!r}",
                              field="direction")  # fmt: skip
        return getattr(self, name)

    def to_json(self) -> dict:
        return {"a2b": self.a2b.to_json(), "b2a": self.b2a.to_json()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, source: str = "impairment JSON"):
        if not isinstance(d, Mapping) or set(d) - set(DIRECTIONS):
            raise ConfigError(
                f"directional impairment must be an object with keys {', '.join(DIRECTIONS)}, "
                f"got {d!r}",
                source=source,
            )
        return cls(*(Impairment.from_json(d.get(k, {}), source=f"{source}: {k}")
                     for k in DIRECTIONS))  # fmt: skip

    def __str__(self) -> str:
        if self.is_symmetric():
            return str(self.a2b)
        return f"a2b: {self.a2b}; b2a: {self.b2a}"

    def merge(self, other: DirectionalImpairment, *, source: str = "--impair"):
        """Each direction merged field by field (Impairment.merge); words over a base are
        parse_directional(text, base=self)."""
        return DirectionalImpairment(self.a2b.merge(other.a2b, source=source),
                                     self.b2a.merge(other.b2a, source=source))  # fmt: skip


_LABEL = re.compile(r"^\s*([A-Za-z0-9_.\-]+?(?:->[A-Za-z0-9_.\-]+)?)\s*:(.*)$", re.DOTALL)


def parse_directional(
    text: str,
    *,
    source: str = "--impair",
    a: str | None = None,
    b: str | None = None,
    base: DirectionalImpairment | None = None,
) -> DirectionalImpairment:
    """Parse `[both:] WORDS; a2b: WORDS; b2a: WORDS` (segments separated by ';').

    An unlabelled or `both:` segment applies to both directions and is applied first; `a2b:`
    and `b2a:` segments are merged on top of it. With node names `a`/`b`, `A->B:` and `B->A:`
    are accepted too. Without any label the spec is symmetric.
    """
    if not text.isascii():
        bad = next(c for c in text if not c.isascii())
        raise ConfigError(
            f"character {bad!r} (U+{ord(bad):04X}) in {text[:80]!r}; accepted: ASCII tc-netem "
            "words (a look-alike character is not the unit or digit it resembles)",
            source=source,
            field="spec",
        )
    labels = {"both": "both", "a2b": "a2b", "b2a": "b2a", "a->b": "a2b", "b->a": "b2a"}
    if a and b:
        labels[f"{a}->{b}"] = "a2b"
        labels[f"{b}->{a}"] = "b2a"
    segs: dict[str, str] = {}
    for raw in text.split(";"):
        if not raw.strip():
            continue
        m = _LABEL.match(raw)
        label, words = ("both", raw) if not m else (m[1], m[2])
        if label not in labels:
            raise ConfigError(
                f"unknown direction {label!r}; valid: {', '.join(labels)}",
                source=source,
                field="direction",
            )
        d = labels[label]
        if d in segs:
            raise ConfigError(
                f"direction {d} given twice; give each of both, a2b, b2a at most once",
                source=source,
                field="direction",
            )
        if m and not words.strip():
            raise ConfigError(
                f"direction {label} has no words; accepted: 'none', a preset or tc-netem words",
                source=source,
                field="direction",
            )
        segs[d] = words
    if text.strip() and not segs:  # "" is no impairment (internal callers); ";" is a slip
        raise ConfigError(
            f"no words in {text!r}; accepted: 'none', a preset or tc-netem words",
            source=source,
            field="spec",
        )
    base = base or DirectionalImpairment()
    out = {}
    for d in DIRECTIONS:
        cur = base.direction(d)
        if "both" in segs:
            cur = parse_spec(segs["both"], source=source, base=cur)
        if d in segs:
            cur = parse_spec(segs[d], source=f"{source} ({d})", base=cur)
        out[d] = cur
    return DirectionalImpairment(**out)


def check_words(text: str, *, source: str = "impairment") -> None:
    """Validate a spec before the lab it is for is found (`lab impair set` checks its words
    first, so bad words are a bad-input error even with no lab up). Node names in labels
    (`client->server:`) are taken as given here; the lab checks them against its nodes."""
    if not text.strip():
        raise ConfigError(
            "empty; accepted: 'none', a preset or tc-netem words (docs/impairment.md)",
            source=source,
            field="spec",
        )
    a = b = None
    for raw in text.split(";"):
        m = _LABEL.match(raw)
        if m and "->" in m[1] and m[1] not in ("a->b", "b->a"):
            a, b = m[1].split("->", 1)
            break
    parse_directional(text, source=source, a=a, b=b)


def needs_engine(text: str | None, *, a: str | None = None, b: str | None = None) -> bool:
    """Whether the words ask for what only the lab's engine does: a trace-driven link (kernel
    netem has none). `a`, `b`: the node names direction labels may use."""
    if not text:
        return False
    d = parse_directional(text, source="--impair", a=a, b=b)
    return d.a2b.trace is not None or d.b2a.trace is not None
