"""supervisor.conf runs exactly the stack's programs, under the names the rest of the stack knows them by."""

from __future__ import annotations

import configparser
import os
import pathlib
import shlex
import subprocess
import sys

from shared.config import ResourceApi
from shared.programs import (
    ALL_PROGRAMS,
    DRA_PROGRAMS,
    PROGRAMS,
    SCANNER,
    WATCHDOG,
    WORKER_DRA,
    WORKERS,
    autostart_environment,
    expected_programs,
)
from shared.resources import Resource

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _programs() -> dict[str, str]:
    """supervisor.conf's program name -> its command."""
    conf = configparser.ConfigParser(interpolation=None)
    conf.read(ROOT / "supervisor.conf")
    return {section.removeprefix("program:"): conf[section]["command"]
            for section in conf.sections() if section.startswith("program:")}


def test_supervisor_conf_has_a_program_for_each_name_and_no_other():
    assert list(_programs()) == list(ALL_PROGRAMS)


def test_each_mode_runs_its_own_programs_and_never_the_other_s():
    assert DRA_PROGRAMS == (SCANNER, WORKER_DRA, WATCHDOG)
    assert not set(WORKERS) & set(DRA_PROGRAMS)


def test_autostart_follows_the_mode_and_no_worker_starts_by_itself():
    """supervisor.conf starts worker-dra in DRA mode only, by the variable `run` sets; supervisord starts no device
    plugin worker by itself: the scanner has it start those the node needs."""
    conf = configparser.ConfigParser(interpolation=None)
    conf.read(ROOT / "supervisor.conf")
    for api in ResourceApi:
        environ = autostart_environment(api)
        started = [name for name in ALL_PROGRAMS
                   if conf[f"program:{name}"].get("autostart", "true").replace("%(ENV_", "").replace(")s", "")
                   in ("true", *(key for key, value in environ.items() if value == "true"))]
        assert started == [SCANNER, *([WORKER_DRA] if api is ResourceApi.DRA else []), WATCHDOG], api


def test_the_programs_that_must_run_are_those_of_the_resources_the_node_has():
    assert expected_programs(ResourceApi.DEVICE_PLUGIN, []) == (SCANNER, WATCHDOG)
    assert expected_programs(ResourceApi.DEVICE_PLUGIN, ["rebellions.ai/npu-vf4"]) \
        == (SCANNER, "worker-npu-vf4", WATCHDOG)
    assert expected_programs(ResourceApi.DEVICE_PLUGIN, [r.value for r in Resource]) == PROGRAMS
    assert expected_programs(ResourceApi.DRA, ["rebellions.ai/npu"]) == DRA_PROGRAMS


def test_the_names_are_the_process_names_of_the_logs():
    assert PROGRAMS == ("scanner", "worker-npu", "worker-npu-vf1", "worker-npu-vf4", "watchdog")


def test_each_program_runs_its_own_process():
    commands = {name: shlex.split(command)[1:] for name, command in _programs().items()}
    assert commands[SCANNER] == ["-m", "scanner"]
    assert commands[WATCHDOG] == ["-m", "kubelet_watchdog"]
    for name in WORKERS:
        assert commands[name] == ["-m", "resource_worker", "--resource", Resource.from_process_name(name).value]
    assert commands[WORKER_DRA] == ["-m", "dra_worker"]


def _program_environment() -> dict[str, str]:
    """The variables supervisor.conf's [supervisord] section gives every program."""
    conf = configparser.ConfigParser(interpolation=None)
    conf.read(ROOT / "supervisor.conf")
    pairs = (item.split("=", 1) for item in conf["supervisord"]["environment"].split(","))
    return {key: value.strip('"') for key, value in pairs}


def test_loguru_adds_no_sink_of_its_own_in_a_program():
    # shared/observability/log.py sets the stream up first thing; loguru's stderr sink would only cost the start
    # its time.
    code = "from loguru import logger; logger.info('before the stream is set up')"
    quiet = subprocess.run([sys.executable, "-c", code], env={**os.environ, **_program_environment()},
                           capture_output=True, text=True, timeout=60)
    plain = subprocess.run([sys.executable, "-c", code], env={**os.environ, "LOGURU_AUTOINIT": "True"},
                           capture_output=True, text=True, timeout=60)
    assert (quiet.returncode, quiet.stderr) == (0, "")
    assert "before the stream is set up" in plain.stderr  # what the setting turns off
