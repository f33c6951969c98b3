"""Fixtures that run the real stack (supervisord and all its programs) against a simulated node,
seen through the kubelet simulator over real unix sockets (tests/support/fixtures.py)."""

from tests.support.fixtures import kubelet, make_node, node_root, start_stack  # noqa: F401
