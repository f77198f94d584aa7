"""The impairment spec language: tc-netem words in, one validated `Impairment` out.

`parse_spec("delay 40ms 5ms 25% distribution normal loss 0.5%")` accepts the words users paste
from `tc qdisc ... netem` (see tc-netem(8)); `Impairment.to_json()` is the form in
docs/impairment-spec.md that the userspace engine consumes; `Impairment.to_netem_words()` is the
canonical tc form the kernel backend passes to `tc` (and which parses back to the same object).
Asymmetric links use `parse_directional("a2b: delay 10ms; b2a: delay 30ms loss 1%")`.
The language is described for users in docs/impairment.md. This module does no I/O.

The code lives in modules with one job each (this module re-exports every name it held, old
private names included, so `from lab.impair.spec import X` keeps working):
    vocab        keywords, units, limits; one value parsed or written
    loss         the loss models and their JSON form
    words        the tc-netem word parser (text -> fields) and the PRESETS it reads
    model        Impairment (validated, canonical; JSON and tc forms) and parse_spec
    linkopts     Mininet TCLink link options -> Impairment
    directional  `a2b: ...; b2a: ...` -> DirectionalImpairment
"""

from __future__ import annotations

from .vocab import (  # noqa: F401
    ALIASES,
    check_pct as _check_pct,
    DISTRIBUTIONS,
    fmt_num as _fmt_num,
    KEYWORDS,
    MAX_TIME_US,
    NETEM_DEFAULT_LIMIT,
    NUM as _NUM,
    OVERHEAD_MAX,
    OVERHEAD_MIN,
    parse_int as _parse_int,
    parse_pct as _parse_pct,
    parse_rate_bps as _parse_rate_bps,
    parse_time_us as _parse_time_us,
    fmt_pct as _pct,
    PCT_RANGE,
    fmt_rate as _rate,
    RATE_UNITS,
    SYNTAX,
    fmt_time as _time,
    TIME_RANGE,
    TIME_UNITS,
    U32_MAX,
    U64_MAX,
    units_list as _units,
    UNSUPPORTED,
    VALUE_START as _VALUE_START,
)
from .loss import (  # noqa: F401
    GELoss,
    Loss,
    loss_from_json as _loss_from_json,
    LOSS_MODELS,
    RandomLoss,
    StateLoss,
)
from .words import (  # noqa: F401
    Fragment as _Fragment,
    _KEYWORD_PARSERS,
    _kw_delay,
    _kw_distribution,
    _kw_gap,
    _kw_limit,
    _kw_loss,
    _kw_prob,
    _kw_rate,
    _kw_seed,
    parse_fragment as _parse_fragment,
    _Tokens,
)
from .model import (  # noqa: F401
    build as _build,
    describe_fields,
    _FIELD_WORD,
    Impairment,
    merge_fields as _merge_fields,
    _normalize,
    parse_spec,
    _PCT_FIELDS,
)
from .linkopts import (  # noqa: F401
    from_link_options,
    LINK_OPTION_KEYS,
)
from .directional import (  # noqa: F401
    DirectionalImpairment,
    DIRECTIONS,
    _LABEL,
    parse_directional,
)
