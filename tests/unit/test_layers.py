"""The packages' layers hold: a module imports only from its own package and from layers below it; every
module names its one job in its docstring; and no function grows past what one reads as one piece.

Layer 0 is shared/; layer 1 the process packages and the simulator, each on shared/ alone; layer 2 the
commands (rbln_device_plugin/), which may use everything. Every import counts, a function's own included:
an import hidden in a function is still an edge of the graph, and a cycle through one still a cycle.

Inside shared/, each subpackage imports only itself and the parts its `MAY_IMPORT` names (its docstring says
why); "shared" there means the vocabulary at shared/'s top, whose own `MAY_IMPORT` is in shared/__init__.py.
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


def _write_tree(root: pathlib.Path, files: Mapping[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_check_finds_hidden_sideways_upward_and_relative_imports(tmp_path):
    _write_tree(tmp_path, {
        "shared/base.py": "import os\n\ndef late():\n    from scanner import main\n",
        "shared/sub/deep.py": "from .. import base\nfrom ...scanner import main\n",
        "scanner/main.py": "from shared import base\nimport kubelet_watchdog.probes\n",
        "simulator/node.py": "from tests import conftest\n",
        "rbln_device_plugin/cli.py": "import scanner.main, kubelet_watchdog, simulator.node\n",
        "kubelet_watchdog/probes.py": "",
    })
    assert violations(tmp_path) == [
        "shared/base.py:4: `from scanner import main`: shared (layer 0) imports scanner (layer 1), upward",
        "shared/sub/deep.py:2: `from ...scanner import main`: shared (layer 0) imports scanner (layer 1), upward",
        "scanner/main.py:2: `import kubelet_watchdog.probes`: scanner (layer 1) imports kubelet_watchdog "
        "(layer 1), sideways",
        "simulator/node.py:1: `from tests import conftest`: simulator imports tests, which the product does not ship",
    ]


def _shared_part(module: str, root: pathlib.Path) -> str | None:
    """The part of shared/ a module belongs to: "shared.<subpackage>", or "shared" for the vocabulary at the top;
    None outside shared/."""
    parts = module.split(".")
    if parts[0] != "shared":
        return None
    if len(parts) > 1 and (root / "shared" / parts[1]).is_dir():
        return f"shared.{parts[1]}"
    return "shared"


def _may_import(root: pathlib.Path, part: str) -> tuple[str, ...]:
    """The `MAY_IMPORT` of a part of shared/, read from its __init__.py without importing it."""
    init = root / pathlib.Path(*part.split(".")) / "__init__.py"
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(target, ast.Name) and target.id == "MAY_IMPORT" for target in targets):
            return tuple(ast.literal_eval(value))
    raise AssertionError(f"{init.relative_to(root)} names no MAY_IMPORT")


def shared_violations(root: pathlib.Path) -> list[str]:
    found = []
    for path in sorted((root / "shared").rglob("*.py")):
        if "_pb2" in path.name:
            continue
        relative = path.relative_to(root)
        own = _shared_part(".".join(relative.with_suffix("").parts), root)
        assert own is not None
        allowed = _may_import(root, own)
        for line, module, statement in imports(path, relative.parent.parts):
            part = _shared_part(module, root)
            if part is not None and part != own and part not in allowed:
                found.append(f"{relative}:{line}: `{statement}`: {own} may import {', '.join(allowed) or 'nothing'}")
    return found


def test_each_part_of_shared_imports_only_what_it_says_it_may():
    assert shared_violations(ROOT) == []


def test_the_check_of_shared_finds_an_import_its_part_does_not_allow(tmp_path):
    _write_tree(tmp_path, {
        "shared/__init__.py": "MAY_IMPORT = ('shared.fs',)\n",
        "shared/config.py": "from shared.fs import atomic\nfrom shared.node import sysfs\n",
        "shared/fs/__init__.py": "MAY_IMPORT: tuple[str, ...] = ()\n",
        "shared/fs/atomic.py": "import shared.config\n",
        "shared/node/__init__.py": "MAY_IMPORT = ('shared', 'shared.fs')\n",
        "shared/node/sysfs.py": "from shared import config\nfrom ..fs import atomic\n",
    })
    assert shared_violations(tmp_path) == [
        "shared/config.py:2: `from shared.node import sysfs`: shared may import shared.fs",
        "shared/fs/atomic.py:1: `import shared.config`: shared.fs may import nothing",
    ]


# A dependency the product reaches through one module of its own only: the module that knows its ways.
DOORS = {"inotify_simple": "shared/fs/inotify.py"}


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


MAX_FUNCTION_LINES = 60
# Code that runs: the product, and the benchmarks that show its targets. Generated stubs aside.
RUNNING_CODE = (*_layer_of(LAYERS), "bench", "deploy")


def _modules(packages: tuple[str, ...]) -> Iterator[tuple[pathlib.Path, ast.Module]]:
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "_pb2" not in path.name:
                yield path.relative_to(ROOT), ast.parse(path.read_text(), str(path))


def long_functions(tree: ast.Module, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Every function (method, nested one) of `tree` longer than `limit` lines, with its length."""
    return [f"{node.name}: {node.end_lineno - node.lineno + 1} lines" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > limit]


def test_every_module_of_the_product_names_its_job_in_its_docstring():
    """A module is one job, named first thing; an empty package marker has no job to name."""
    unnamed = [str(path) for path, tree in _modules(tuple(_layer_of(LAYERS)))
               if tree.body and not (ast.get_docstring(tree) or "").strip()]
    assert unnamed == []


def test_no_function_is_longer_than_one_reads_as_one_piece():
    too_long = [f"{path}: {function}" for path, tree in _modules(RUNNING_CODE) for function in long_functions(tree)]
    assert too_long == []


def test_the_length_check_counts_a_function_from_its_def_to_its_last_line():
    def body(indent: str) -> str:
        return "".join(f"{indent}x = {n}\n" for n in range(59))
    tree = ast.parse(f"def fits():\n{body('    ')}\n\nclass C:\n    def long(self):\n{body(' ' * 8)}        pass\n")
    assert long_functions(tree) == ["long: 61 lines"]
