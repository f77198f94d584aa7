"""One parameter schema for every place a user names a value: VPN profile parameters (and their
`--vpn name:key=value` overrides), measurement test parameters, topology host and link options.

A schema is a `{name: Param}` mapping; `validate` checks a given mapping against it and returns it
with defaults filled in. Every error is a ConfigError naming the source, the field (the
parameter's name, after `field_prefix`) and the accepted values. Pure data: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lab.core.errors import ConfigError, ConfigErrors, did_you_mean


@dataclass(frozen=True)
class Param:
    """One accepted parameter: its type, default, one-line doc and allowed values."""

    type: type | tuple[type, ...]
    default: Any = None
    doc: str = ""
    choices: Sequence[Any] | None = None
    min: float | None = None
    max: float | None = None
    #: None is accepted (the default is None) and means "not set"
    optional: bool = False
    #: extra check returning an error message or None
    check: Callable[[Any], str | None] | None = None
    #: unit of min/max, shown with the accepted values ("Mbit/s")
    unit: str = ""
    #: the accepted values in words, where type, choices and range cannot say them
    accepts: str = ""

    @property
    def types(self) -> tuple[type, ...]:
        return self.type if isinstance(self.type, tuple) else (self.type,)

    def accepted(self) -> str:
        if self.accepts:
            return self.accepts
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        what = " or ".join(t.__name__ for t in self.types)
        lo = f" >= {self.min}" if self.min is not None else ""
        hi = f" <= {self.max}" if self.max is not None else ""
        sep = " and" if lo and hi else ""
        unit = f" {self.unit}" if self.unit and (lo or hi) else ""
        return f"{what}{lo}{sep}{hi}{unit}" + (" or null" if self.optional else "")

    def from_text(self, raw: str) -> Any:
        """A command-line string (`--vpn wireguard:mtu=1400`) as this parameter's type; raises
        ValueError when it is not one."""
        types = self.types
        if bool in types:
            if raw.lower() in ("true", "false", "1", "0", "yes", "no"):
                return raw.lower() in ("true", "1", "yes")
            if len(types) == 1:
                raise ValueError(raw)
        for t in types:
            if t is not bool:
                try:
                    return t(raw)
                except ValueError:
                    pass
        raise ValueError(raw)


def value_error(
    p: Param, why: str, *, name: str, source: str, owner: str = "", field_prefix: str = ""
) -> ConfigError:
    """`{why} ({owner}); accepted: {p.accepted()}`, field `field_prefix + name`."""
    where = f" ({owner})" if owner else ""
    return ConfigError(
        f"{why}{where}; accepted: {p.accepted()}", source=source, field=field_prefix + name
    )


def validate(
    schema: Mapping[str, Param],
    given: Mapping[str, Any] | None,
    *,
    source: str,
    owner: str = "",
    field_prefix: str = "",
    noun: str = "parameter",
) -> dict[str, Any]:
    """Check `given` against `schema` (names, types, choices, ranges, checks); returns every
    parameter of the schema, the given ones and the defaults of the others.

    `owner` ("test 'tcp'", "driver 'wireguard'") goes into the messages, `field_prefix`
    ("params.", "link a-b: ") before the parameter's name in the error's field.
    """
    accepted = ", ".join(sorted(schema)) or "(none)"
    for_owner = f" for {owner}" if owner else ""
    if given is not None and not isinstance(given, Mapping):
        raise ConfigError(
            f"{noun}s{for_owner} must be a table/mapping, got {type(given).__name__}; "
            f"accepted keys: {accepted}",
            source=source,
            field=field_prefix.rstrip(": ") or None,
        )
    given = dict(given or {})
    unknown = sorted(set(given) - set(schema), key=str)
    if unknown:  # every unknown name at once, each with the nearest accepted one
        errors = [
            ConfigError(
                f"unknown {noun}{for_owner}{did_you_mean(str(k), schema)}; accepted: {accepted}",
                source=source,
                field=f"{field_prefix}{k}",
            )
            for k in unknown
        ]
        raise errors[0] if len(errors) == 1 else ConfigErrors(errors, source=source)
    out: dict[str, Any] = {}
    for name, p in schema.items():
        value = given.get(name, p.default)
        out[name] = check_value(
            p, value, name=name, source=source, owner=owner, field_prefix=field_prefix
        )
    return out


def check_value(
    p: Param, value: Any, *, name: str, source: str, owner: str = "", field_prefix: str = ""
) -> Any:
    """`value` checked against `p` (an int for a float parameter becomes a float)."""

    def bad(why: str) -> ConfigError:
        return value_error(p, why, name=name, source=source, owner=owner, field_prefix=field_prefix)

    if value is None:
        if p.optional:
            return None
        raise bad("missing value")
    types = p.types
    # bool is an int in Python; a TOML `true` or Python `True` for a number is a typo, not a 1
    if isinstance(value, bool) and bool not in types:
        raise bad(f"got {value!r}")
    number = float in types and isinstance(value, int) and not isinstance(value, bool)
    if not number and not isinstance(value, types):
        raise bad(f"got {type(value).__name__} {value!r}")
    if p.choices is not None and value not in p.choices:
        raise bad(f"got {value!r}")
    # written `not >=` so that a NaN is out of every range
    if (p.min is not None and not value >= p.min) or (p.max is not None and not value <= p.max):
        raise bad(f"got {value!r}")
    if number:
        try:
            value = float(value)
        except OverflowError:  # an int beyond any float, and no max to stop it
            raise bad(f"got {value!r}") from None
    if p.check is not None:
        msg = p.check(value)
        if msg:
            raise bad(msg)
    return value
