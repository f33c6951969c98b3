"""Reading metrics as a scraper sees them: the running stack's /metrics, for the tests that drive it (the
integration tests and the check with a real Prometheus server), and collectors scraped in process."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from shared.observability.metrics import PATH
from simulator.stack import StackProcess

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
# The watchdog derives the state metrics at each check, every 2 s.
STATE_DELAY = 2.0


def metrics_port(stack: StackProcess) -> int:
    return stack.wait_for_record("Metrics endpoint listening", timeout=30)[0]["port"]


def scrape_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{PATH}", timeout=5) as answer:
        return answer.read().decode()


def parse(text: str) -> Samples:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def scrape(*collectors) -> Samples:
    """What a scrape of `collectors` shows, parsed back from the text format."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return parse(generate_latest(registry).decode())


def families(text: str) -> set[str]:
    """The family names a page declares (its # TYPE lines; a counter's ends in _total)."""
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def series(samples: Samples, name: str, **labels: str) -> list[dict[str, str]]:
    """The label sets of every series of `name` that has `labels` among its own."""
    return [dict(key) for sample_name, key in samples if sample_name == name and set(labels.items()) <= set(key)]


def wait_for_scrape(port: int, predicate: Callable[[Samples], bool], what: str,
                    timeout: float = 10 * STATE_DELAY) -> Samples:
    deadline = time.monotonic() + timeout
    while True:
        samples = parse(scrape_text(port))
        if predicate(samples):
            return samples
        if time.monotonic() >= deadline:
            shown = "\n".join(f"{name}{dict(labels)} {v}" for (name, labels), v in sorted(samples.items())
                              if not name.endswith("_bucket"))
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}; last scrape:\n{shown}")
        time.sleep(0.2)
