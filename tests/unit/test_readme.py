"""CI runs the README's test command, and the README's first command is the zero-hardware demo."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    return re.findall(r"```sh\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_opens_with_install_and_simulate_then_tests():
    install_and_demo, tests = readme_commands()[:2]
    assert "pip install ." in install_and_demo and install_and_demo.endswith("rbln-device-plugin simulate")
    assert "pip install '.[test]'" in tests


def test_ci_runs_exactly_the_readme_test_command():
    test_command = readme_commands()[1].split("&&")[-1].strip()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines
