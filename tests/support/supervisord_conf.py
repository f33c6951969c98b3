"""A supervisord of a test's own: the configuration its tests share, and supervisor.conf's hooks as they are there."""

from __future__ import annotations

import configparser
import pathlib
import textwrap

from shared.supervision import transport

ROOT = pathlib.Path(__file__).resolve().parents[2]


def base_conf(run_dir: pathlib.Path, log: pathlib.Path) -> str:
    """supervisord in `run_dir` (its socket with the stack's credentials, written here), logging to `log` at info,
    with its own XML-RPC interface; a test adds its programs and hooks."""
    transport.write_credentials(run_dir)
    return textwrap.dedent(f"""\
        [supervisord]
        nodaemon=true
        logfile={log}
        loglevel=info
        pidfile={run_dir}/supervisord.pid
        childlogdir={run_dir}

        [unix_http_server]
        file={transport.socket_path(run_dir)}
        chmod=0600

        [include]
        files={run_dir / transport.CREDENTIALS_FILE}

        [rpcinterface:supervisor]
        supervisor.rpcinterface_factory=supervisor.rpcinterface:make_main_rpcinterface

        """)


def hook_section(name: str) -> str:
    """supervisor.conf's own `[rpcinterface:<name>]` section, as it is there."""
    conf = configparser.RawConfigParser()
    conf.read(ROOT / "supervisor.conf")
    factory = conf[f"rpcinterface:{name}"]["supervisor.rpcinterface_factory"]
    return f"[rpcinterface:{name}]\nsupervisor.rpcinterface_factory={factory}\n"
