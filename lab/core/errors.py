"""The lab's error hierarchy. Only the CLI maps these to exit codes and prints them."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class LabError(Exception):
    """Base of every error the lab raises on purpose."""

    exit_code = 1


class ConfigError(LabError):
    """Bad user input: topology, profile, impairment spec, plan, CLI arguments.

    Raised before anything is created. The message names the file, the field and the accepted
    values.
    """

    exit_code = 2

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        self.source = source
        self.field = field
        self.message = message
        where = ": ".join(p for p in (source, field) if p)
        super().__init__(f"{where}: {message}" if where else message)


class ConfigErrors(ConfigError):
    """Every problem found in one input (a plan file), reported together: one line each, naming
    its field (issue 32 item 14). `errors` holds them, nested ones flattened."""

    def __init__(self, errors: Iterable[ConfigError], *, source: str | None = None):
        flat: list[ConfigError] = []
        for e in errors:
            flat += e.errors if isinstance(e, ConfigErrors) else [e]
        self.errors = flat
        head = f"{source}: " if source else ""
        lines = []
        for e in flat:
            text = str(e)
            lines.append(text.removeprefix(head) if head else text)
        n = len(flat)
        message = f"{n} problems:\n  " + "\n  ".join(lines)
        super().__init__(message, source=source)
        self.field = flat[0].field if flat else None  # the first problem's, for code reading one


def near_misses(word: str, choices: Iterable, *, most: int = 2, cutoff: float = 0.6) -> list[str]:
    """The `choices` (at most `most`, nearest first) that a mistyped `word` likely meant: those
    difflib finds at least `cutoff` alike, then any the word is without its unit suffix
    (`duration` for `duration_s`, `rate` for `rate_mbit`), whatever difflib's ratio says."""
    choices = [c for c in choices if isinstance(c, str)]
    if not isinstance(word, str) or not word or word in choices:
        return []
    near = difflib.get_close_matches(word, choices, n=most, cutoff=cutoff)
    near += [c for c in choices if c.startswith(word + "_") and c not in near]
    return near[:most]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """ " (did you mean 'x'?)" for the nearest of `choices` to a mistyped `word` (near_misses),
    else ""."""
    near = near_misses(word, choices)
    return f" (did you mean {' or '.join(map(repr, near))}?)" if near else ""


def reject_unknown(
    table: Iterable, accepted: Iterable, *, source: str | None, where: str = ""
) -> None:
    """Refuse the keys of `table` not in `accepted`: ConfigError naming the first unknown key as
    the field (under `where`), every unknown one, a near miss's likely meaning (near_misses, the
    nearest only and by a stricter ratio, as the message may list several), and the accepted
    keys in the order given."""
    accepted = list(accepted)
    unknown = sorted(set(map(str, table)) - set(map(str, accepted)))
    if not unknown:
        return
    hints = [
        f"{u!r}: did you mean {close[0]!r}?"
        for u in unknown
        if (close := near_misses(u, map(str, accepted), most=1, cutoff=0.75))
    ]
    raise ConfigError(
        f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}"
        + (f" ({'; '.join(hints)})" if hints else "")
        + f"; accepted: {', '.join(map(str, accepted))}",
        source=source,
        field=f"{where}.{unknown[0]}" if where else unknown[0],
    )


class PreconditionError(LabError):
    """This machine lacks something the request needs (tool, kernel feature, root, free id)."""

    exit_code = 3


class KernelFeatureMissing(PreconditionError):
    """This kernel lacks a data plane the request needs; the full-kernel VM (--vm) has it."""


class CommandError(LabError):
    """An external command failed. Carries argv, namespace, exit code and the tail of stderr."""

    exit_code = 4

    def __init__(self, argv, returncode, stderr="", *, where: str | None = None, stdout=""):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr or ""
        self.stdout = stdout or ""
        self.where = where
        tail = "\n".join(self.stderr.strip().splitlines()[-8:])
        loc = f" in {where}" if where else ""
        msg = f"command failed{loc} (exit {returncode}): {' '.join(map(str, self.argv))}"
        if tail:
            msg += "\n" + tail
        super().__init__(msg)


class StartupError(LabError):
    """Something the lab started (a daemon, a tunnel) did not come up; carries a log tail."""

    exit_code = 5


class TeardownIncomplete(LabError):
    """Teardown finished but could not remove everything; `leftovers` lists what remains."""

    exit_code = 6

    def __init__(self, leftovers: list[str]):
        self.leftovers = leftovers
        super().__init__("teardown incomplete; left over:\n  " + "\n  ".join(leftovers))
