"""The `lab` command line. The only module that prints or exits; errors map to exit codes here.

This module parses the arguments (lab.cli.parser) and dispatches to a command's function: a lab's
life in lab.cli.labs, campaigns and results in lab.cli.runs, boards, profiles and architectures
in lab.cli.boards, lab.cli.profiles and lab.cli.arch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from lab.cli.help import exec_words
from lab.cli.parser import build_parser, check_args, impair_set_words
from lab.cli.printing import err
from lab.core.errors import LabError, TeardownIncomplete
import traceback


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])  # forwarded verbatim to a VM lab
    try:
        if args.cmd == "impair" and args.impair_cmd == "set":
            impair_set_words(args)
        if args.cmd == "exec":
            exec_words(args)
        check_args(args)
        return command(args.cmd)(args) or 0
    except TeardownIncomplete as e:
        _debug(args)
        err.print(f"[yellow]lab:[/] {e}", markup=True, highlight=False)
        return e.exit_code
    except LabError as e:
        _debug(args)
        err.print(f"lab: error: {e}", markup=False, highlight=False, soft_wrap=True)
        return e.exit_code
    except KeyboardInterrupt:
        err.print("lab: interrupted")
        return 130
    except Exception as e:  # a bug of the lab, not of the input: one line, --debug for more
        if args.debug:
            raise
        err.print(
            f"lab: internal error (a bug in lab, not in your input): {type(e).__name__}: {e}; "
            "`lab --debug ...` shows the traceback",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        return INTERNAL_ERROR


#: exit code of an error that is the lab's own bug (sysexits.h EX_SOFTWARE)
INTERNAL_ERROR = 70


def _debug(args: argparse.Namespace) -> None:
    if getattr(args, "debug", False):
        err.print(traceback.format_exc().rstrip(), markup=False, highlight=False)


COMMANDS = {
    "run": "lab.cli.runs:cmd_run",
    "report": "lab.cli.runs:cmd_report",
    "merge": "lab.cli.runs:cmd_merge",
    "compare": "lab.cli.runs:cmd_compare",
    "impair": "lab.cli.labs:cmd_impair",
    "up": "lab.cli.labs:cmd_up",
    "render": "lab.cli.profiles:cmd_render",
    "profiles": "lab.cli.profiles:cmd_profiles",
    "down": "lab.cli.labs:cmd_down",
    "clean": "lab.cli.labs:cmd_clean",
    "status": "lab.cli.labs:cmd_status",
    "exec": "lab.cli.labs:cmd_exec",
    "shell": "lab.cli.labs:cmd_shell",
    "calibrate": "lab.cli.runs:cmd_calibrate",
    "boards": "lab.cli.boards:cmd_boards",
    "import": "lab.cli.runs:cmd_import",
    "check": "lab.cli.runs:cmd_check",
    "ci": "lab.cli.runs:cmd_ci",
    "arch": "lab.cli.arch:cmd_arch",
}


def command(name: str):
    """The function of command `name`. Each command's module is imported when that command
    runs, so `lab --help` or `lab status` do not load the campaign and report stack (about
    0.4 s); tests/test_layers.py counts these modules as imported by this one."""
    module, _, func = COMMANDS[name].partition(":")
    return getattr(importlib.import_module(module), func)


if __name__ == "__main__":
    sys.exit(main())
