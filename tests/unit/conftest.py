"""Fixtures shared by the unit tests."""

import pytest
from loguru import logger


@pytest.fixture
def logs():
    """Every record logged during the test: level name, message and the event's keys."""
    records = []
    sink = logger.add(lambda m: records.append({"level": m.record["level"].name, "msg": m.record["message"],
                                                **m.record["extra"]}), level="DEBUG", format="{message}")
    yield records
    logger.remove(sink)
