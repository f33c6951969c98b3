import os

from tests.support.fixtures import short_tmp  # noqa: F401

# The conformance scenarios drive the stack with the real kubelet's device manager: they need root and
# a Go build, so tests/conformance/run.sh runs them with their own configuration, never this run.
# tests/nfd and tests/cdi likewise: their run.sh builds real NFD programs and the CDI reference library's checker.
# tests/dra likewise: its run.sh builds kube-apiserver, etcd and the kubelet's DRA manager.
collect_ignore = ["conformance", "nfd", "cdi", "dra"]


# CI runs the same examples every time, so a landing never depends on luck; local runs keep exploring.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
