"""The original plugin's command line: `rbln-device-plugin` with no subcommand, or with only its flags.

The original is a Go program. Its DaemonSets (its chart's, the NPU operator's) start it as plain
`rbln-device-plugin`, with its settings in the environment or as flags. Here that command line does
what `rbln-device-plugin run` does, and its flags are read as Go's flag package reads them:

- `-name` and `--name` alike; the value follows `=`, or, except for a boolean flag, is the next
  argument whatever it looks like; a boolean flag alone means true and takes a value only after `=`
  (`--use-generic-resource-name false` leaves `false` as an argument);
- reading stops at the first argument that is not a flag (a lone `-` is one) or after `--`, and an
  argument left over is an error, since the original took none;
- a repeated flag's last value counts; `-h`/`-help` show the help and `-version` the version (on
  stderr; they are boolean flags too, so `-help=false` is no help), and a flag the original did not
  have is an error.

All of that is here, apart from `rbln_device_plugin/cli.py`, which only hands such a command line over.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import sys
from collections.abc import Callable, Sequence

from shared.config import OPTIONS, parse_bool

# The settings the original had flags for, with its flag names.
ORIGINAL_FLAGS = ("--cdi-root", "--kubelet-device-plugin-path", "--healthcheck-port", "--device-scan-interval",
                  "--otlp-endpoint", "--use-generic-resource-name")
_OPTIONS = {option.flag.removeprefix("--"): option for option in OPTIONS if option.flag in ORIGINAL_FLAGS}
_HELP = frozenset({"h", "help"})
_VERSION = "version"


class Action(enum.Enum):
    RUN = "run"
    HELP = "help"
    VERSION = "version"


@dataclasses.dataclass(frozen=True)
class OriginalCommandLine:
    action: Action
    values: dict[str, str]
    """Settings.field -> value, as `run`'s flags give them."""


class UsageError(ValueError):
    """The command line is not one the original took; the message says what is wrong."""


def applies(argv: Sequence[str]) -> bool:
    """No subcommand: nothing at all, or a flag first."""
    return not argv or argv[0].startswith("-")


def parse(argv: Sequence[str]) -> OriginalCommandLine:
    values: dict[str, str] = {}
    switches = {"help": False, "version": False}
    bare_boolean = ""  # the last flag read, when it was a boolean one without a value
    rest = list(argv)
    while rest and len(rest[0]) > 1 and rest[0][0] == "-":
        given = rest.pop(0)
        bare_boolean = ""
        if given == "--":
            break
        name, has_value, value = given.removeprefix("-").removeprefix("-").partition("=")
        if not name or name[0] == "-":
            raise UsageError(f"bad flag syntax: {given}")
        option = _OPTIONS.get(name)
        if name in _HELP or name == _VERSION or (option is not None and option.boolean):
            on = _switch(given, name, value) if has_value else True
            bare_boolean = "" if has_value else given
            if option is not None:
                values[option.field] = "true" if on else "false"
            else:
                switches["help" if name in _HELP else "version"] = on
        elif option is not None:
            if not has_value:
                if not rest:
                    raise UsageError(f"flag needs an argument: {given}")
                value = rest.pop(0)
            values[option.field] = value
        else:
            raise UsageError(f"flag provided but not defined: {given} (without a subcommand only the original "
                             f"plugin's flags are taken: {', '.join(ORIGINAL_FLAGS)}; the others belong to `run`)")
    # The original's order: help (which takes no argument), then version (whatever follows), then run.
    if rest and not (switches["version"] and not switches["help"]):
        hint = f" (a boolean flag takes its value after '=': {bare_boolean}={rest[0]})" if bare_boolean else ""
        raise UsageError(f"arguments not supported: {' '.join(rest)}{hint}")
    if switches["help"]:
        return OriginalCommandLine(Action.HELP, values)
    if switches["version"]:
        return OriginalCommandLine(Action.VERSION, values)
    return OriginalCommandLine(Action.RUN, values)


def _switch(given: str, name: str, value: str) -> bool:
    try:
        return parse_bool(value)
    except ValueError:
        raise UsageError(f"invalid boolean value {value!r} for -{name}: {given}") from None


def run_command_line(argv: Sequence[str], build_parser: Callable[[], argparse.ArgumentParser]) -> None:
    """Do what the command line asks: run the stack (exec, does not return), or show help or version."""
    try:
        line = parse(argv)
    except UsageError as exc:
        print(f"rbln-device-plugin: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if line.action is not Action.RUN:
        # The parser's own help and version (they go to stderr), so both command lines show the same.
        build_parser().parse_args([f"--{line.action.value}"])
    from rbln_device_plugin.run import run

    run(argparse.Namespace(**line.values))
