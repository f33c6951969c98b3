"""docs/ describes the interface the code has: its settings, metric families and log records, each list held
to the one place the code defines it, and no page or module points at a document outside the repository."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess

from shared.config import OPTIONS
from shared.observability import log
from shared.observability.metrics import FAMILIES

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# The processes' packages, whose records the catalogue lists.
LOGGING_PACKAGES = ("shared", "scanner", "resource_worker", "kubelet_watchdog", "dra_worker")
_LEVEL_METHODS = {"debug", "info", "warning", "error", "log", "_log_wait", "_announce"}


def _table_rows(page: str) -> list[list[str]]:
    """The cells of every row of every table on the page (header and separator rows left out)."""
    rows = []
    for line in (DOCS / page).read_text().splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _code(cell: str) -> str:
    """`x` -> x; anything else (empty, a word) -> ''."""
    match = re.fullmatch(r"`([^`]+)`", cell)
    return match[1] if match else ""


def test_the_settings_table_is_the_code_s_list_of_settings():
    rows = {row[1]: row for row in _table_rows("configuration.md") if _code(row[1])}
    environment = {_code(row[1]) for row in rows.values()}
    assert environment == {option.env for option in OPTIONS} | {log.LEVEL_ENV, log.FORMAT_ENV}
    for option in OPTIONS:
        flag, _env, default, _meaning = rows[f"`{option.env}`"]
        assert _code(flag) == (option.flag or ""), option.env
        assert (_code(default) or default) == (option.default or "empty"), option.env
    assert _code(rows[f"`{log.LEVEL_ENV}`"][2]) == log.DEFAULT_LEVEL
    assert _code(rows[f"`{log.FORMAT_ENV}`"][2]) == log.DEFAULT_FORMAT


def test_the_metrics_table_is_the_code_s_list_of_families():
    rows = {_code(row[0]): row for row in _table_rows("metrics.md") if _code(row[0])}
    assert sorted(rows) == sorted(family.name for family in FAMILIES)
    for family in FAMILIES:
        _name, kind, labels, _meaning = rows[family.name]
        assert kind == family.kind.value, family.name
        assert re.findall(r"`(\w+)`", labels) == list(family.labels), family.name


def _logged_messages() -> set[str]:
    """Every message the processes log: the literal text given to a logger call, or to the worker's
    once-per-reason helper, or a module constant such a call names."""
    messages = set()
    trees = [ast.parse(path.read_text()) for package in LOGGING_PACKAGES for path in (ROOT / package).rglob("*.py")]
    # Module constants, which a call may name (they are imported by that name too).
    constants = {target.id: node.value.value for tree in trees for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 for target in node.targets if isinstance(target, ast.Name)}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in _LEVEL_METHODS:
                # log(level, message), _log_wait(level, message, ...) and the log file's _announce(level,
                # message, fields); the others take the message first.
                position = 1 if node.func.attr in ("log", "_log_wait", "_announce") else 0
                argument = node.args[position] if len(node.args) > position else None
                if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                    messages.add(argument.value)
                elif isinstance(argument, ast.Name) and argument.id in constants:
                    messages.add(constants[argument.id])
            # The fallbacks of log setup are logged later, from their message field.
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Fallback":
                messages.add(node.args[0].value)
    return messages


def test_the_log_catalogue_lists_every_record_the_stack_logs_and_no_other():
    catalogued = {_code(row[0]) for row in _table_rows("logs.md") if (_code(row[0]) and " " in _code(row[0]))
                  or _code(row[0]) == "Shutdown"}
    logged = _logged_messages()
    assert len(logged) > 60
    assert sorted(logged - catalogued) == [], "logged, not in docs/logs.md"
    assert sorted(catalogued - logged) == [], "in docs/logs.md, never logged"


def test_the_catalogue_names_each_record_once():
    names = [_code(row[0]) for row in _table_rows("logs.md") if _code(row[0])]
    messages = [name for name in names if " " in name or name == "Shutdown"]
    assert len(messages) == len(set(messages))


def test_nothing_points_at_a_document_outside_the_repository():
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True)
    files = tracked.stdout.split() if tracked.returncode == 0 else [
        str(path.relative_to(ROOT)) for path in ROOT.rglob("*") if path.is_file() and ".venv" not in path.parts]
    outside = re.compile("CONTRACT" + r"(\.md| *§)")
    offenders = [name for name in files if name.endswith((".py", ".md", ".conf", ".toml", ".sh", ".yaml"))
                 and (ROOT / name).is_file() and outside.search((ROOT / name).read_text(errors="replace"))]
    assert offenders == []


def test_every_link_between_the_docs_leads_to_a_page_and_heading_that_exist():
    broken = []
    pages = [*DOCS.glob("*.md"), ROOT / "README.md"]
    for page in pages:
        for target, anchor in re.findall(r"\]\(([\w./-]*\.md)?(?:#([\w-]+))?\)", page.read_text()):
            linked = (page.parent / target).resolve() if target else page
            if not linked.is_file():
                broken.append(f"{page.name}: {target}")
            elif anchor and anchor not in _anchors(linked):
                broken.append(f"{page.name}: {target}#{anchor}")
    assert broken == []


def _anchors(page: pathlib.Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", page.read_text(), re.M)}
