"""The impairment spec language: tc-netem words in, one validated `Impairment` out.

`parse_spec("delay 40ms 5ms 25% distribution normal loss 0.5%")` accepts the words users paste
from `tc qdisc ... netem` (see tc-netem(8)); `Impairment.to_json()` is the form in
docs/impairment-spec.md that the userspace engine consumes; `Impairment.to_netem_words()` is the
canonical tc form the kernel backend passes to `tc` (and which parses back to the same object).
Asymmetric links use `parse_directional("a2b: delay 10ms; b2a: delay 30ms loss 1%")`.
The language is described for users in docs/impairment.md. This module does no I/O.

The code lives in modules with one job each (this module re-exports every name it held, old
private names included, so `from lab.model.impairment.spec import X` keeps working):
    vocab        keywords, units, limits; one value parsed or written
    loss         the loss models and their JSON form
    words        the tc-netem word parser (text -> fields) and the PRESETS it reads
    model        Impairment (validated, canonical; JSON and tc forms) and parse_spec
    linkopts     Mininet TCLink link options -> Impairment
    directional  `a2b: ...; b2a: ...` -> DirectionalImpairment
"""

from __future__ import annotations
