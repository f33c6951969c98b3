"""`rbln-device-plugin`: the command operators and the container entrypoint use (docs/commands.md)."""

from __future__ import annotations

import argparse
import sys

from shared.version import VERSION


class _StderrParser(argparse.ArgumentParser):
    """stdout carries only log records, so help, version and usage go to stderr."""

    def _print_message(self, message, file=None):  # argparse's hook for everything it prints
        if message:
            sys.stderr.write(message)


def build_parser() -> argparse.ArgumentParser:
    from rbln_device_plugin import logs, simulate, status, topology
    from rbln_device_plugin.original_cli import ORIGINAL_FLAGS
    from rbln_device_plugin.run import add_run_flags

    parser = _StderrParser(prog="rbln-device-plugin",
                           description="Kubernetes device plugin for Rebellions NPUs.",
                           epilog="Without a command, or with only the original plugin's flags "
                                  f"({', '.join(ORIGINAL_FLAGS)}, in Go's -flag, --flag=value and "
                                  "--flag value forms), it runs the stack as `run` does.")
    parser.add_argument("--version", action="version", version=f"rbln-device-plugin {VERSION}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_StderrParser)
    add_run_flags(commands.add_parser("run", help="run the stack in the foreground under supervisord "
                                                  "(the entrypoint)"))
    simulate.add_arguments(commands.add_parser("simulate", help="run the stack on a simulated node with a "
                                                                "simulated kubelet"))
    status.add_arguments(commands.add_parser("status", help="show each process's state and each resource's "
                                                            "registration"))
    logs.add_arguments(commands.add_parser("logs", help="show one process's records from its log files, "
                                                        "for a person"))
    topology.add_arguments(commands.add_parser("topology", help="draw the node's PCI forest as placement sees it"))
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    from rbln_device_plugin import original_cli

    if original_cli.applies(argv):
        original_cli.run_command_line(argv, build_parser)
        return
    args = build_parser().parse_args(argv)
    if args.command == "run":
        from rbln_device_plugin.run import run

        run(args)
    elif args.command == "simulate":
        from rbln_device_plugin.simulate import simulate

        raise SystemExit(simulate(args))
    elif args.command == "status":
        from rbln_device_plugin.status import run as show_status

        raise SystemExit(show_status(args))
    elif args.command == "logs":
        from rbln_device_plugin.logs import run as show_logs

        raise SystemExit(show_logs(args))
    elif args.command == "topology":
        from rbln_device_plugin.topology import run as show_topology

        raise SystemExit(show_topology(args))
