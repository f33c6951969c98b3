"""The kinds of metric family: a module of its own, so that the value-file writer
(shared/fence/prometheus_value_files.py) and the families (shared/observability/metrics.py, which imports the
writer) both name them. The values are prometheus_client's names, which its multiprocess files carry in their
file names."""

from __future__ import annotations

import enum


class Kind(enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"
