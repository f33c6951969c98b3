"""Test modules stay leaves: what two suites share lives in tests/support/ (or a suite's own helper module),
never in a test module or a conftest another file imports. Every import counts, a function's own included."""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Where test code lives: the suites, and the benchmarks that reuse their attack clients.
SCANNED = ("tests", "bench")


def imported_modules(path: pathlib.Path) -> Iterator[tuple[int, list[str]]]:
    """(line, modules) for every import statement of a file, at any depth; `from package import name` gives
    both the package and package.name, since either may be the module imported."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, [alias.name]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]


def is_test_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "tests" and any(part.startswith("test_") or part == "conftest" for part in parts[1:])


def violations(root: pathlib.Path, scanned: tuple[str, ...] = SCANNED) -> list[str]:
    found = []
    for directory in scanned:
        for path in sorted((root / directory).rglob("*.py")):
            for line, modules in imported_modules(path):
                offending = [module for module in modules if is_test_module(module)]
                if offending:
                    found.append(f"{path.relative_to(root)}:{line}: imports {offending[0]}; tests/support/ is "
                                 "where shared helpers live")
    return found


def test_no_file_imports_a_test_module_or_a_conftest():
    assert violations(ROOT) == []


def test_the_rule_sees_each_way_of_importing_a_test_module(tmp_path):
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "test_a.py").write_text(
        "from tests.unit.test_ipc import record\n"
        "from tests.integration import test_faults\n"
        "import tests.unit.test_watchdog\n"
        "from tests.integration.conftest import node_root\n"
        "def later():\n"
        "    from tests.deploy.test_chart import render\n")
    (tmp_path / "tests" / "unit" / "test_b.py").write_text(
        "from tests.support.waiting import wait_until\nfrom tests.deploy import something\nimport tests\n")
    assert [finding.split(": ")[1].split(";")[0] for finding in violations(tmp_path, ("tests",))] == [
        "imports tests.unit.test_ipc", "imports tests.integration.test_faults", "imports tests.unit.test_watchdog",
        "imports tests.integration.conftest", "imports tests.deploy.test_chart"]
