"""The packages' layers hold: a module imports only from its own package and from layers below it; and no
module grows past what one reads as one piece.

Layer 0 is shared/; layer 1 the process packages and the simulator, each on shared/ alone; layer 2 the
commands (rbln_device_plugin/), which may use everything. Every import counts, a function's own included:
an import hidden in a function is still an edge of the graph, and a cycle through one still a cycle.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator, Mapping

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAYERS = (("shared",), ("scanner", "resource_worker", "kubelet_watchdog", "dra_worker", "simulator"),
          ("rbln_device_plugin",))
# Never imported by the product: what a wheel does not ship.
OUTSIDE = ("tests", "bench", "deploy", "protos")


def _layer_of(layers: tuple[tuple[str, ...], ...]) -> dict[str, int]:
    return {package: level for level, packages in enumerate(layers) for package in packages}


def imports(path: pathlib.Path, package_path: tuple[str, ...]) -> Iterator[tuple[int, str, str]]:
    """(line, imported module, the statement) for every import in the file, at any depth; a relative
    import is resolved against `package_path`, the file's package."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ast.unparse(node)
        elif isinstance(node, ast.ImportFrom):
            base = package_path[:len(package_path) - node.level + 1] if node.level else ()
            module = ".".join([*base, *([node.module] if node.module else [])])
            yield node.lineno, module, ast.unparse(node)


def violations(root: pathlib.Path, layers: tuple[tuple[str, ...], ...] = LAYERS,
               outside: tuple[str, ...] = OUTSIDE) -> list[str]:
    layer: Mapping[str, int] = _layer_of(layers)
    found = []
    for package, level in layer.items():
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            package_path = relative.parent.parts
            for line, module, statement in imports(path, package_path):
                top = module.split(".")[0]
                if top in outside:
                    found.append(f"{relative}:{line}: `{statement}`: {package} imports {top}, which the product "
                                 "does not ship")
                elif top in layer and top != package and layer[top] >= level:
                    way = "sideways" if layer[top] == level else "upward"
                    found.append(f"{relative}:{line}: `{statement}`: {package} (layer {level}) imports {top} "
                                 f"(layer {layer[top]}), {way}")
    return found


def test_no_module_imports_sideways_or_upward():
    assert violations(ROOT) == []


def test_every_package_of_the_wheel_has_its_layer():
    import tomllib

    wheel = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert sorted(wheel["packages"]) == sorted(_layer_of(LAYERS))


def _write(root: pathlib.Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_check_finds_hidden_sideways_upward_and_relative_imports(tmp_path):
    _write(tmp_path, "shared/base.py", "import os\n\ndef late():\n    from scanner import main\n")
    _write(tmp_path, "shared/sub/deep.py", "from .. import base\nfrom ...scanner import main\n")
    _write(tmp_path, "scanner/main.py", "from shared import base\nimport kubelet_watchdog.probes\n")
    _write(tmp_path, "simulator/node.py", "from tests import conftest\n")
    _write(tmp_path, "rbln_device_plugin/cli.py", "import scanner.main, kubelet_watchdog, simulator.node\n")
    _write(tmp_path, "kubelet_watchdog/probes.py", "")
    assert violations(tmp_path) == [
        "shared/base.py:4: `from scanner import main`: shared (layer 0) imports scanner (layer 1), upward",
        "shared/sub/deep.py:2: `from ...scanner import main`: shared (layer 0) imports scanner (layer 1), upward",
        "scanner/main.py:2: `import kubelet_watchdog.probes`: scanner (layer 1) imports kubelet_watchdog "
        "(layer 1), sideways",
        "simulator/node.py:1: `from tests import conftest`: simulator imports tests, which the product does not ship",
    ]


# A dependency the product reaches through one module of its own only: the module that knows its ways.
DOORS = {"inotify_simple": "shared/inotify.py"}


def test_a_dependency_with_a_door_is_imported_through_it_alone():
    found = []
    for package in _layer_of(LAYERS):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            for line, module, statement in imports(path, relative.parent.parts):
                door = DOORS.get(module.split(".")[0])
                if door is not None and str(relative) != door:
                    found.append(f"{relative}:{line}: `{statement}`: through {door} only")
    assert found == []


MAX_MODULE_LINES = 500
MAX_MODULE_BYTES = 18 * 1024


def test_no_module_of_the_product_is_too_big_to_read_as_one_piece():
    """Generated stubs aside: a module past these sizes holds more than one job."""
    too_big = []
    for package in _layer_of(LAYERS):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "_pb2" in path.name:
                continue
            text = path.read_bytes()
            lines = text.count(b"\n")
            if lines > MAX_MODULE_LINES or len(text) > MAX_MODULE_BYTES:
                too_big.append(f"{path.relative_to(ROOT)}: {lines} lines, {len(text)} bytes")
    assert too_big == []
