"""The original plugin's command line (rbln_device_plugin.original_cli) and how `rbln-device-plugin` hands it over.

The table's expectations are what the original made of each command line: its flags defined as in its
main.go, run through Go's flag package under urfave/cli v2.25.3 (the version it pins), in a scratch
program outside the repository.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rbln_device_plugin import cli, original_cli
from rbln_device_plugin import run as run_command
from rbln_device_plugin.original_cli import Action, UsageError, parse

RUN, HELP, VERSION = Action.RUN, Action.HELP, Action.VERSION
FIELDS = {"cdi-root": "cdi_root", "kubelet-device-plugin-path": "kubelet_device_plugin_path",
          "healthcheck-port": "healthcheck_port", "device-scan-interval": "device_scan_interval",
          "otlp-endpoint": "otlp_endpoint", "use-generic-resource-name": "use_generic_resource_name"}
BOOLEAN = "use-generic-resource-name"
STRING_FLAGS = [name for name in FIELDS if name != BOOLEAN]


def values(**by_flag: str) -> dict[str, str]:
    return {FIELDS[name.replace("_", "-")]: value for name, value in by_flag.items()}


@pytest.mark.parametrize(("argv", "action", "expected"), [
    ([], RUN, {}),
    (["--cdi-root=/a"], RUN, values(cdi_root="/a")),
    (["-cdi-root=/a"], RUN, values(cdi_root="/a")),
    (["--cdi-root", "/a"], RUN, values(cdi_root="/a")),
    (["-cdi-root", "/a"], RUN, values(cdi_root="/a")),
    (["--cdi-root="], RUN, values(cdi_root="")),
    (["--cdi-root=/a=b"], RUN, values(cdi_root="/a=b")),
    (["--cdi-root=/a", "--cdi-root=/b"], RUN, values(cdi_root="/b")),
    # The next argument is the value, whatever it looks like.
    (["--cdi-root", "--kubelet-device-plugin-path=/b"], RUN, values(cdi_root="--kubelet-device-plugin-path=/b")),
    (["--healthcheck-port", "-1"], RUN, values(healthcheck_port="-1")),
    (["--otlp-endpoint", ""], RUN, values(otlp_endpoint="")),
    (["--use-generic-resource-name"], RUN, values(use_generic_resource_name="true")),
    (["-use-generic-resource-name"], RUN, values(use_generic_resource_name="true")),
    (["--use-generic-resource-name=false"], RUN, values(use_generic_resource_name="false")),
    (["--use-generic-resource-name=FALSE"], RUN, values(use_generic_resource_name="false")),
    (["--use-generic-resource-name=0"], RUN, values(use_generic_resource_name="false")),
    (["--use-generic-resource-name=T"], RUN, values(use_generic_resource_name="true")),
    (["--"], RUN, {}),
    (["--help"], HELP, {}), (["-h"], HELP, {}), (["-help"], HELP, {}), (["--h"], HELP, {}), (["-h=1"], HELP, {}),
    (["--cdi-root=/a", "--help"], HELP, values(cdi_root="/a")),
    (["--version", "--help"], HELP, {}),
    (["--version"], VERSION, {}), (["-version"], VERSION, {}),
    (["--version", "extra"], VERSION, {}),
    (["--help=false"], RUN, {}), (["--version=false"], RUN, {}),
    # Values are checked where every setting is, when the stack starts (the original checked these too).
    (["--healthcheck-port=abc"], RUN, values(healthcheck_port="abc")),
])
def test_command_lines_the_original_took(argv, action, expected):
    assert parse(argv) == original_cli.OriginalCommandLine(action, expected)


@pytest.mark.parametrize(("argv", "error"), [
    (["--cdi-root"], "flag needs an argument: --cdi-root"),
    (["--use-generic-resource-name", "false"],
     "arguments not supported: false (a boolean flag takes its value after '=': --use-generic-resource-name=false)"),
    (["--use-generic-resource-name=yes"], "invalid boolean value 'yes'"),
    (["--use-generic-resource-name="], "invalid boolean value ''"),
    (["---cdi-root=/a"], "bad flag syntax: ---cdi-root=/a"),
    (["-=x"], "bad flag syntax: -=x"),
    (["--=x"], "bad flag syntax: --=x"),
    (["--", "--cdi-root=/a"], "arguments not supported: --cdi-root=/a"),
    (["-"], "arguments not supported: -"),
    (["--cdi-root=/a", "run"], "arguments not supported: run"),
    (["--help", "extra"], "arguments not supported: extra"),
    (["-v"], "flag provided but not defined: -v"),
    (["--foo"], "flag provided but not defined: --foo"),
    (["--CDI-ROOT=/a"], "flag provided but not defined: --CDI-ROOT=/a"),
    (["--help", "--foo"], "flag provided but not defined: --foo"),
    # The stack's other settings are flags of `run`, not of the original.
    (["--sysfs-root=/sys"], "flag provided but not defined: --sysfs-root=/sys"),
])
def test_command_lines_the_original_refused(argv, error):
    with pytest.raises(UsageError) as refused:
        parse(argv)
    assert str(refused.value).startswith(error) and "\n" not in str(refused.value)


# A flag's value in every form Go accepts; a string flag's value may be anything, a leading dash too.
def _rendered(draw, name: str, value: str) -> list[str]:
    dashes = draw(st.sampled_from(["-", "--"]))
    if name == BOOLEAN:
        return [f"{dashes}{name}"] if value == "true" and draw(st.booleans()) else [f"{dashes}{name}={value}"]
    if draw(st.booleans()):
        return [f"{dashes}{name}={value}"]
    return [f"{dashes}{name}", value]


@st.composite
def command_lines(draw):
    settings = draw(st.lists(st.one_of(
        st.tuples(st.sampled_from(STRING_FLAGS), st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)),
        st.tuples(st.just(BOOLEAN), st.sampled_from(["true", "false"])),
    ), max_size=8))
    argv = [part for name, value in settings for part in _rendered(draw, name, value)]
    if draw(st.booleans()):
        argv.append("--")
    return argv, {FIELDS[name]: value for name, value in settings}  # the last value of each flag


@given(command_lines())
def test_every_form_of_every_flag_gives_the_last_value_of_each(case):
    argv, expected = case
    assert parse(argv) == original_cli.OriginalCommandLine(RUN, expected)


def test_the_flags_are_the_originals_and_the_run_command_has_them_all():
    assert set(original_cli.ORIGINAL_FLAGS) == {f"--{name}" for name in FIELDS}
    run_flags = {action.option_strings[0] for action in _run_parser()._actions if action.option_strings}
    assert set(original_cli.ORIGINAL_FLAGS) <= run_flags


def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    run_command.add_run_flags(parser)
    return parser


@pytest.mark.parametrize(("flags", "value"), [(["--use-generic-resource-name"], "true"),
                                              (["--use-generic-resource-name", "false"], "false"),
                                              (["--use-generic-resource-name=0"], "0"), ([], None)])
def test_run_takes_the_boolean_flag_bare_or_with_a_value(flags, value):
    assert _run_parser().parse_args(flags).use_generic_resource_name == value


# -- the hand-over in `rbln-device-plugin` ---------------------------------------------------------

@pytest.fixture
def started(monkeypatch):
    """What `run` would have started the stack with (the exec is not done)."""
    calls: list[argparse.Namespace] = []
    monkeypatch.setattr(run_command, "run", calls.append)
    return calls


@pytest.mark.parametrize("argv", [[], ["--cdi-root=/a", "-healthcheck-port", "9"]])
def test_no_subcommand_runs_the_stack_with_the_flags_as_run_would(started, argv):
    cli.main(argv)
    (args,) = started
    assert vars(args) == parse(argv).values
    environ = run_command.stack_environment(args, {"CDI_ROOT": "/from-env", "HEALTHCHECK_PORT": "1"})
    if argv:  # flags win over the environment, as in the original
        assert (environ["CDI_ROOT"], environ["HEALTHCHECK_PORT"]) == ("/a", "9")
    else:
        assert (environ["CDI_ROOT"], environ["HEALTHCHECK_PORT"]) == ("/from-env", "1")


@pytest.mark.parametrize(("argv", "shown"), [(["--help"], "usage: rbln-device-plugin"),
                                             (["-help"], "the original plugin's flags"),
                                             (["--version"], "rbln-device-plugin "),
                                             (["-version"], "rbln-device-plugin ")])
def test_help_and_version_go_to_stderr(started, capsys, argv, shown):
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    out, err = capsys.readouterr()
    assert exited.value.code == 0 and out == "" and shown in err and started == []


def test_a_usage_error_is_one_line_on_stderr_and_exit_2(started, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--cdi-root"])
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == "" and err == "rbln-device-plugin: flag needs an argument: --cdi-root\n"
    assert started == []


def test_the_named_commands_still_parse_as_before(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["status", "--help"])
    out, err = capsys.readouterr()
    assert exited.value.code == 0 and out == "" and err.startswith("usage: rbln-device-plugin status")
    with pytest.raises(SystemExit) as exited:
        cli.main(["start"])
    assert exited.value.code == 2 and "invalid choice: 'start'" in capsys.readouterr().err


def test_run_loads_no_other_command_and_parses_as_the_whole_command_line_does():
    # A fresh interpreter: what `rbln-device-plugin run` imports before it execs supervisord.
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys; from rbln_device_plugin import cli; "
                               "cli.build_parser('run').parse_args(['run']); print(' '.join(sys.modules))"],
        capture_output=True, text=True, check=True).stdout.split()
    others = [f"rbln_device_plugin.{name}" for name in cli.COMMANDS if name != "run"]
    assert not {*others, "grpc", "simulator.kubelet", "loguru"} & set(loaded)
    assert "rbln_device_plugin.run" in loaded

    def run_help(parser):
        (commands,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
        return commands.choices["run"].format_help()

    assert run_help(cli.build_parser("run")) == run_help(cli.build_parser())
    assert set(run_help(cli.build_parser()).split()) >= {"--cdi-root", "--run-dir"}
