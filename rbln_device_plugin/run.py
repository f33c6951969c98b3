"""`rbln-device-plugin run`: turn flags into the stack's environment and exec supervisord.

supervisord replaces this process, so in a container it is PID 1 and receives
the kubelet's termination signal directly.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from collections.abc import Mapping
from typing import Any

from rbln_device_plugin.mode_exclusivity import other_mode_conflict
from shared.config import OPTIONS, RUN_DIR_ENV, ConfigError, Settings
from shared.fs.safe_open import ensure_private_dir
from shared.observability.metrics_dir import reset_metrics_dir
from shared.programs import autostart_environment
from shared.supervision import transport

PYTHON_ENV = "RBLN_DEVICE_PLUGIN_PYTHON"
# Every file the stack creates (log files on a hostPath among them) is private to root and its group.
STACK_UMASK = 0o027


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    for option in OPTIONS:
        if option.flag:
            # A boolean flag may stand alone, meaning true.
            bare: dict[str, Any] = {"nargs": "?", "const": "true"} if option.boolean else {}
            parser.add_argument(option.flag, dest=option.field, metavar=option.env, **bare,
                                help=f"{option.help} (env {option.env}, default {option.default or 'empty'})")


def supervisor_conf() -> pathlib.Path:
    """The installed copy inside the package, else the one at the top of a source tree."""
    package_dir = pathlib.Path(__file__).resolve().parent
    for candidate in (package_dir / "supervisor.conf", package_dir.parent / "supervisor.conf"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("supervisor.conf is neither installed with the package nor in the source tree")


def stack_environment(args: argparse.Namespace, base: Mapping[str, str]) -> dict[str, str]:
    """The environment every process of the stack gets: flags win over inherited variables,
    and every setting is present (supervisor.conf expands some of them)."""
    environ = dict(base)
    for option in OPTIONS:
        value = getattr(args, option.field, None)
        if value is not None:
            environ[option.env] = value
        environ.setdefault(option.env, option.default)
    environ[PYTHON_ENV] = sys.executable
    return environ


def supervisord_argv(conf: pathlib.Path, uid: int) -> list[str]:
    """supervisord on `conf`, as user `uid`. supervisor.conf says user=root, which supervisord only
    takes from root (it cannot switch users otherwise); run by anyone else, it is told to stay who it is
    (supervisord looks the uid up: it must have a passwd entry)."""
    argv = [sys.executable, "-m", "supervisor.supervisord", "-n", "-c", str(conf)]
    return argv if uid == 0 else [*argv, f"--user={uid}"]


def run(args: argparse.Namespace) -> None:
    environ = stack_environment(args, os.environ)
    try:
        settings = Settings.from_environ(environ)
    except ConfigError as exc:
        print(f"rbln-device-plugin run: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    conflict = other_mode_conflict(settings)
    if conflict is not None:
        print(f"rbln-device-plugin run: {conflict}", file=sys.stderr)
        raise SystemExit(2)
    environ.update(autostart_environment(settings.resource_api))
    os.umask(STACK_UMASK)
    try:
        ensure_private_dir(settings.run_dir, RUN_DIR_ENV)
        transport.write_credentials(settings.run_dir)
        reset_metrics_dir(settings.run_dir, enabled=settings.metrics_port >= 0)
    except OSError as exc:
        print(f"rbln-device-plugin run: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    # Temporary files (supervisord makes one at start-up to find a writable temp dir) stay in the
    # private run dir rather than a /tmp shared with whatever else the node runs.
    environ.setdefault("TMPDIR", str(settings.run_dir))
    argv = supervisord_argv(supervisor_conf(), os.getuid())
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, environ)
