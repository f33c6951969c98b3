"""supervisord's `[rpcinterface:started]` (shared/fence/supervisord_started.py) as supervisor.conf configures it, in a
real supervisord: a program confirmed up is RUNNING at once, long before its `startsecs`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import xmlrpc.client

import pytest

from shared.supervision.client import connect, server_proxy
from tests.support.supervisord_conf import ROOT, base_conf, hook_section
from tests.support.waiting import wait_until

TIMEOUT = 30.0


def test_a_confirmed_program_is_running_before_its_startsecs(short_tmp):
    conf = short_tmp / "supervisord.conf"
    conf.write_text(base_conf(short_tmp, short_tmp / "supervisord.log") + hook_section("started") + textwrap.dedent(f"""
        [program:slow]
        command={sys.executable} -c "import signal; signal.pause()"
        startsecs=3600
        """))
    supervisord = subprocess.Popen([sys.executable, "-m", "supervisor.supervisord", "-n", "-c", str(conf)],
                                   cwd=ROOT)
    try:
        supervisor = connect(short_tmp)

        def starting():
            try:
                return supervisor.programs().get("slow", {}).get("statename") == "STARTING"
            except Exception:
                return False

        wait_until(starting, TIMEOUT, "the program STARTING")
        pid = supervisor.programs()["slow"]["pid"]
        proxy = server_proxy(short_tmp)
        assert proxy.started.confirm("slow", pid + 1) is False, "another process's word counts for nothing"
        assert supervisor.programs()["slow"]["statename"] == "STARTING"
        supervisor.confirm_started({"slow": pid})
        assert supervisor.programs()["slow"]["statename"] == "RUNNING"
        assert proxy.started.confirm("slow", pid) is False, "RUNNING already"
        with pytest.raises(xmlrpc.client.Fault):
            proxy.started.confirm("nothing", pid)
    finally:
        supervisord.terminate()
        supervisord.wait(TIMEOUT)
