"""`rbln-device-plugin`: the command operators and the container entrypoint use (docs/commands.md)."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NamedTuple

from shared.version import VERSION


class _StderrParser(argparse.ArgumentParser):
    """stdout carries only log records, so help, version and usage go to stderr."""

    def _print_message(self, message, file=None):  # argparse's hook for everything it prints
        if message:
            sys.stderr.write(message)


class Command(NamedTuple):
    """A command: its help line, the module that defines it, and that module's functions that add its
    arguments and run it (returning the exit code, or not at all)."""

    summary: str
    module: str
    add_arguments: str
    run: str


# A command's module is imported only when the parser needs that command: `run`, the container's
# entrypoint, then loads none of the others (simulate alone brings gRPC, the kubelet simulator and
# the node builder), and supervisord starts that much sooner.
COMMANDS = {
    "run": Command("run the stack in the foreground under supervisord (the entrypoint)",
                   "rbln_device_plugin.run", "add_run_flags", "run"),
    "simulate": Command("run the stack on a simulated node with a simulated kubelet",
                        "rbln_device_plugin.simulate", "add_arguments", "simulate"),
    "status": Command("show each process's state and each resource's registration",
                      "rbln_device_plugin.status", "add_arguments", "run"),
    "logs": Command("show one process's records from its log files, for a person",
                    "rbln_device_plugin.logs", "add_arguments", "run"),
    "topology": Command("draw the node's PCI forest as placement sees it",
                        "rbln_device_plugin.topology", "add_arguments", "run"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with `only`, the same parser knowing that one command alone."""
    from rbln_device_plugin.original_cli import ORIGINAL_FLAGS

    parser = _StderrParser(prog="rbln-device-plugin",
                           description="Kubernetes device plugin for Rebellions NPUs.",
                           epilog="Without a command, or with only the original plugin's flags "
                                  f"({', '.join(ORIGINAL_FLAGS)}, in Go's -flag, --flag=value and "
                                  "--flag value forms), it runs the stack as `run` does.")
    parser.add_argument("--version", action="version", version=f"rbln-device-plugin {VERSION}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_StderrParser)
    for name, command in COMMANDS.items():
        if only in (None, name):
            add_arguments = getattr(importlib.import_module(command.module), command.add_arguments)
            add_arguments(commands.add_parser(name, help=command.summary))
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    from rbln_device_plugin import original_cli

    if original_cli.applies(argv):
        original_cli.run_command_line(argv, build_parser)
        return
    args = build_parser(argv[0] if argv and argv[0] in COMMANDS else None).parse_args(argv)
    command = COMMANDS[args.command]
    result = getattr(importlib.import_module(command.module), command.run)(args)
    if args.command != "run":  # run execs supervisord; the others return their exit code
        raise SystemExit(result)
