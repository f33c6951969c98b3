"""supervisord's program table and the programs' status files as the watchdog reads them, at plain defaults."""

from __future__ import annotations

from shared.programs import PROGRAMS


def running(**overrides):
    programs = {name: {"statename": "RUNNING", "pid": 100 + i, "start": 1000, "now": 1001,
                       "description": f"pid {100 + i}, uptime 0:00:01"}
                for i, name in enumerate(PROGRAMS)}
    for name, state in overrides.items():
        programs[name.replace("_", "-")]["statename"] = state
    return programs


def scanner_status(programs, monotonic=50.0, **resources):
    return {"pid": programs["scanner"]["pid"], "monotonic": monotonic,
            "resources": {"rebellions.ai/npu": 0, "rebellions.ai/npu-vf1": 0, "rebellions.ai/npu-vf4": 0,
                          **{f"rebellions.ai/{k.replace('_', '-')}": v for k, v in resources.items()}}}


def worker_status(programs, name, **fields):
    return {"pid": programs[name]["pid"], "registered": True, "streams": 1, "deviceCount": 4,
            "healthyCount": 3, "unhealthyCount": 1, "scannedAt": 49.0, **fields}
