#!/usr/bin/env python3
"""Stage 1 of deploy/container/Dockerfile without a container engine.

The Dockerfile's first stage copies the build context (the repository root less
what `.dockerignore` excludes) and runs `pip wheel --no-deps .` in it. This
script builds the same context in a temporary directory, checks that nothing
which must stay out got in (.git, virtual environments, caches), runs the same
`pip wheel --no-deps` there and checks the wheel: the packages, the
`supervisor.conf` that `rbln-device-plugin run` execs supervisord on, the
generated gRPC stubs and the `rbln-device-plugin` console script of the
ENTRYPOINT. tests/deploy/test_entrypoint.py installs that wheel and runs it
the way the image does, with the ENTRYPOINT and ENV read from the Dockerfile's
final stage (`image_entrypoint`, `image_environment`).

    python deploy/image_context.py [--keep DIR]

`.dockerignore` matching follows Docker's rules for the patterns the project
uses: paths relative to the context root, `*`/`?`/`[...]` within one path
segment, `**` across segments, a pattern that matches a directory excludes all
below it, `!` re-includes, the last matching pattern wins.
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "deploy" / "container" / "Dockerfile"
MUST_BE_EXCLUDED = (".git", ".venv", ".ci/venv", ".pytest_cache")
WHEEL_MUST_CONTAIN = (
    "shared/supervisor.conf",
    "shared/cli.py",
    "shared/deviceplugin/v1beta1/api_pb2.py",
    "shared/deviceplugin/v1beta1/api_pb2_grpc.py",
    "scanner/__init__.py",
    "resource_worker/__init__.py",
    "kubelet_watchdog/__init__.py",
)
ENTRYPOINT_SCRIPT = "rbln-device-plugin"


def _glob_segment(segment: str) -> str:
    """One path segment of a pattern as a regex: `*` and `?` never cross a `/`."""
    out, i = [], 0
    while i < len(segment):
        char = segment[i]
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[" and "]" in segment[i + 1:]:
            end = segment.index("]", i + 1)
            body = segment[i + 1:end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]")
            i = end
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


def _pattern_regex(pattern: str) -> str:
    """`a/**/b` matches a/b, a/x/b, a/x/y/b; a leading `**/` matches at any depth."""
    regex = ""
    segments = pattern.split("/")
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            regex += ".*" if last else "(?:[^/]+/)*"
        else:
            regex += _glob_segment(segment) + ("" if last else "/")
    return regex


def load_patterns(dockerignore: pathlib.Path) -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for raw in dockerignore.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        # A match on a directory covers everything below it.
        rules.append((include, re.compile(rf"^{_pattern_regex(pattern)}(?:/.*)?$", re.DOTALL)))
    return rules


def excluded(relative: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    result = False
    for include, regex in rules:
        if regex.match(relative):
            result = not include
    return result


def build_context(destination: pathlib.Path) -> list[str]:
    """Copy the repository into `destination` as Docker would send it; the relative paths copied."""
    rules = load_patterns(ROOT / ".dockerignore")
    copied = []
    for directory, dirnames, filenames in os.walk(ROOT):
        relative_dir = os.path.relpath(directory, ROOT)
        relative_dir = "" if relative_dir == "." else relative_dir
        # Prune excluded directories unless a later `!` rule could re-include something below them.
        has_negation = any(include for include, _ in rules)
        dirnames[:] = [d for d in dirnames
                       if has_negation or not excluded(os.path.join(relative_dir, d), rules)]
        for name in filenames:
            relative = os.path.join(relative_dir, name)
            if excluded(relative, rules):
                continue
            target = destination / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / relative, target, follow_symlinks=False)
            copied.append(relative)
    return copied


class WheelBuildError(RuntimeError):
    """`pip wheel --no-deps` failed in the build context; the message carries pip's output."""


def build_wheel(context: pathlib.Path, wheel_dir: pathlib.Path) -> pathlib.Path:
    """The Dockerfile's stage-1 command, run in `context`; the one wheel it wrote into `wheel_dir`."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-cache-dir",
         "--no-deps", "--wheel-dir", str(wheel_dir), "."],
        cwd=context, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise WheelBuildError(f"pip wheel --no-deps failed in the build context:\n{result.stdout}{result.stderr}")
    built = sorted(wheel_dir.glob("*.whl"))
    if len(built) != 1:
        raise WheelBuildError(f"pip wheel produced {[w.name for w in built]}, expected one wheel")
    return built[0]


def context_problems(copied: list[str]) -> list[str]:
    problems = []
    for path in MUST_BE_EXCLUDED:
        leaked = [p for p in copied if p == path or p.startswith(path + "/")]
        if leaked:
            problems.append(f".dockerignore lets {path} into the build context ({len(leaked)} files)")
    leaked_caches = [p for p in copied if "__pycache__" in p.split("/") or p.endswith(".pyc")]
    if leaked_caches:
        problems.append(f".dockerignore lets {len(leaked_caches)} bytecode files into the build context")
    return problems


def wheel_problems(wheel: pathlib.Path) -> list[str]:
    """What the image needs from the wheel: the packages, supervisor.conf, the stubs, the ENTRYPOINT script."""
    problems = []
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for required in WHEEL_MUST_CONTAIN:
            if required not in names:
                problems.append(f"{wheel.name} lacks {required}")
        entry_points = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        if not entry_points:
            return problems + [f"{wheel.name} has no entry_points.txt"]
        parser = configparser.ConfigParser()
        parser.read_string(archive.read(entry_points[0]).decode())
    scripts = parser["console_scripts"] if parser.has_section("console_scripts") else {}
    if ENTRYPOINT_SCRIPT not in scripts:
        problems.append(f"{wheel.name} has no console script {ENTRYPOINT_SCRIPT} (the image's ENTRYPOINT)")
    return problems


def stage_one(wheel_dir: pathlib.Path) -> tuple[pathlib.Path, list[str]]:
    """Stage 1 of the Dockerfile without Docker: the .dockerignore'd context in a temporary directory,
    `pip wheel --no-deps` in it. The wheel (in `wheel_dir`) and what is wrong with the context or the wheel."""
    if not (ROOT / ".dockerignore").is_file():
        raise WheelBuildError(f"{ROOT / '.dockerignore'} is missing: the build context would carry .git, "
                              "venvs and caches")
    with tempfile.TemporaryDirectory(prefix="rbln-image-context-") as work:
        context = pathlib.Path(work)
        copied = build_context(context)
        print(f"build context: {len(copied)} files "
              f"({sum((context / p).stat().st_size for p in copied) // 1024} KiB)")
        wheel = build_wheel(context, wheel_dir)
    print(f"wheel: {wheel.name}")
    return wheel, context_problems(copied) + wheel_problems(wheel)


def check(keep: pathlib.Path | None) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="rbln-image-wheel-") as scratch:
        try:
            return stage_one(keep or pathlib.Path(scratch))[1]
        except WheelBuildError as exc:
            return [str(exc)]


def instructions(dockerfile: pathlib.Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text(encoding="utf-8"))
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def final_stage(dockerfile: pathlib.Path = DOCKERFILE) -> list[tuple[str, str]]:
    """The instructions of the stage that becomes the image: from its FROM on."""
    found = instructions(dockerfile)
    last_from = max(index for index, (keyword, _) in enumerate(found) if keyword == "FROM")
    return found[last_from:]


def image_entrypoint(dockerfile: pathlib.Path = DOCKERFILE) -> list[str]:
    """The exec-form ENTRYPOINT of the image, as argv."""
    (entrypoint,) = [args for keyword, args in final_stage(dockerfile) if keyword == "ENTRYPOINT"]
    argv = json.loads(entrypoint)
    if not (isinstance(argv, list) and argv and all(isinstance(arg, str) for arg in argv)):
        raise ValueError(f"ENTRYPOINT {entrypoint} is not in exec form")
    return argv


def image_environment(dockerfile: pathlib.Path = DOCKERFILE) -> dict[str, str]:
    """What the image's ENV instructions set (the KEY=VALUE form)."""
    environment = {}
    for keyword, args in final_stage(dockerfile):
        if keyword == "ENV":
            for assignment in shlex.split(args):
                key, separator, value = assignment.partition("=")
                if not separator:
                    raise ValueError(f"ENV {args!r} is not in the KEY=VALUE form")
                environment[key] = value
    return environment


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=pathlib.Path, help="keep the built wheel in this directory")
    args = parser.parse_args(argv)
    problems = check(args.keep)
    for problem in problems:
        print(f"ERROR {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
