"""The scanner's start: its first scan is published before anything it can do later (scanner.main.run), on a
simulated node with the real publisher."""

from __future__ import annotations

import pathlib
import shutil
import tempfile

import pytest

from scanner import main as scanner_main
from shared.config import Settings
from shared.observability.metrics import Recorder
from shared.resources import Resource
from shared.supervision.process_lifecycle import ShutdownSignal
from simulator.node import build_node
from simulator.spec import NodeSpec


@pytest.fixture
def node_root():
    root = pathlib.Path(tempfile.mkdtemp(prefix="rbln-scan-", dir="/tmp"))  # unix socket paths stay short
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_the_first_scan_is_published_before_the_metrics_families_are_made(node_root, monkeypatch):
    node = build_node(node_root, NodeSpec.parse("2"))
    settings = Settings.from_environ(node.env())
    shutdown = ShutdownSignal({})
    events: list[str] = []
    publish = scanner_main.InventoryPublisher.publish

    def publish_and_note(publisher, message):
        events.append(f"publish {message.resource.value}")
        publish(publisher, message)

    class NotingRecorder(Recorder):
        def load(self, *args, **kwargs):
            events.append("load")
            super().load(*args, **kwargs)

        def flush(self):
            events.append("flush")
            super().flush()
            shutdown.request()  # one scan is enough

    monkeypatch.setattr(scanner_main.InventoryPublisher, "publish", publish_and_note)
    scanner_main.run(settings, shutdown, NotingRecorder(None))
    assert events == [f"publish {resource.value}" for resource in Resource] + ["load", "flush"]
