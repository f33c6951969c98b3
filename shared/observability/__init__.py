"""Logs, metrics and traces: the JSON log stream and files, every Prometheus family and the recorder, OTLP
traces, and request IDs bounded as logs and errors carry them. May import the vocabulary, `fs`, and `fence`
(the value files the metrics are written in)."""

MAY_IMPORT = ("shared", "shared.fs", "shared.fence")
