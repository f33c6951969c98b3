"""Reading the CDI spec dirs as a runtime does, cheaply enough for every scan (policy: shared/cdi/spec.py).

A runtime reads every `.json` and `.yaml` file of each directory (no subdirectories; a `.yml` is not a
spec to it), each with a YAML decoder, JSON being YAML. Here a file is read again only when its identity,
size or modification time changed since the last scan, and a directory is listed again only when its own
modification time changed; everything else comes from the last scan. Spec dirs may hold anything, so what
is read is bounded: the files of a directory, the bytes of a file and the nodes of a YAML document.
JSON is read by the standard library; PyYAML is imported only when a file is not JSON.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import stat
import time
from collections.abc import Callable, Sequence
from typing import Any

from shared.cdi.spec import LoadedSpec, Scalar, SpecError, Tree, load

SPEC_SUFFIXES = (".json", ".yaml")
# The toolkit's spec is a few KiB; a node has a handful of specs.
MAX_SPEC_BYTES = 1024 * 1024
MAX_SPECS_PER_DIR = 256
MAX_YAML_NODES = 200_000
# A file or listing read within this time of its last change may have changed again within the same tick
# of the file system's clock (a coarse one ticks every few milliseconds): it is read again at the next scan.
_SETTLE_NS = 1_000_000_000

_FileKey = tuple[int, int, int, int, int]


def _tree_from_json(value: Any) -> Tree:
    if isinstance(value, dict):
        return {key: _tree_from_json(entry) for key, entry in value.items()}
    if isinstance(value, list):
        return [_tree_from_json(entry) for entry in value]
    if value is None:
        return None
    if isinstance(value, str):
        return Scalar(value, quoted=True)
    if isinstance(value, bool):
        return Scalar("true" if value else "false")
    return Scalar(repr(value) if isinstance(value, float) else str(value))


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise SpecError(f"mapping key {key[:40]!r} is defined twice")
        result[key] = value
    return result


def _tree_from_yaml(text: str) -> Tree:
    """The first YAML document as a tree (the decoder reads no further), its scalars as written."""
    import yaml  # PyYAML: only for a spec that is not JSON

    def convert(node: Any, budget: list[int]) -> Tree:
        budget[0] -= 1
        if budget[0] < 0:
            raise SpecError(f"the document has more than {MAX_YAML_NODES} nodes")
        if isinstance(node, yaml.ScalarNode):
            # A plain scalar has no style (None from the Python parser, '' from libyaml's).
            if node.tag == "tag:yaml.org,2002:null" and not node.style:
                return None
            return Scalar(node.value, quoted=bool(node.style))
        if isinstance(node, yaml.SequenceNode):
            return [convert(entry, budget) for entry in node.value]
        mapping: dict[str, Tree] = {}
        merged: list[Any] = []
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise SpecError("a mapping key is not a scalar")
            if key_node.tag == "tag:yaml.org,2002:merge" and not key_node.style:
                # `<<: *anchor` (or a list of them): their keys, where the mapping has none of its own.
                merged += value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                continue
            if key_node.value in mapping:
                raise SpecError(f"mapping key {key_node.value[:40]!r} is defined twice")
            mapping[key_node.value] = convert(value_node, budget)
        for source in merged:
            if not isinstance(source, yaml.MappingNode):
                raise SpecError("a merge key names no mapping")
            for key, value in convert(source, budget).items():
                mapping.setdefault(key, value)
        return mapping

    try:
        documents = yaml.compose_all(text, Loader=yaml.CSafeLoader if hasattr(yaml, "CSafeLoader")
                                     else yaml.SafeLoader)
        first = next(documents, None)
    except yaml.YAMLError as exc:
        raise SpecError(f"not YAML: {str(exc).splitlines()[0][:200]}") from None
    if first is None:
        raise SpecError("the file is empty")
    return convert(first, [MAX_YAML_NODES])


def parse_spec_text(data: bytes) -> Tree:
    """A spec file's content as a tree; SpecError if it is neither JSON nor YAML."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError("not UTF-8 text") from None
    try:
        return _tree_from_json(json.loads(text, object_pairs_hook=_json_object))
    except ValueError:
        return _tree_from_yaml(text)
    except RecursionError:
        raise SpecError("nested too deeply") from None


def read_spec(path: str, dir_index: int) -> LoadedSpec:
    """One spec file, read with bounds; a file that cannot be read is a spec that is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        return LoadedSpec(path, dir_index, error=f"cannot open: {exc.strerror or exc}")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return LoadedSpec(path, dir_index, error="not a regular file")
        data = os.read(fd, MAX_SPEC_BYTES + 1)
    except OSError as exc:
        return LoadedSpec(path, dir_index, error=f"cannot read: {exc.strerror or exc}")
    finally:
        os.close(fd)
    if len(data) > MAX_SPEC_BYTES:
        return LoadedSpec(path, dir_index, error=f"larger than {MAX_SPEC_BYTES} bytes")
    try:
        tree = parse_spec_text(data)
    except (SpecError, RecursionError) as exc:
        return LoadedSpec(path, dir_index, error=str(exc) if isinstance(exc, SpecError) else "nested too deeply")
    return load(path, dir_index, tree)


@dataclasses.dataclass(frozen=True)
class DirsView:
    """What one read of the spec dirs found."""

    specs: tuple[LoadedSpec, ...]
    dir_errors: tuple[str, ...] = ()
    """Directories that exist but cannot be listed, and those holding more spec files than are read."""


def _file_key(info: os.stat_result) -> _FileKey:
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


@dataclasses.dataclass(frozen=True)
class _Cached:
    key: _FileKey
    read_at_ns: int

    def still(self, key: _FileKey) -> bool:
        """Whether what was read then is what a read now would find."""
        return key == self.key and max(key[3], key[4]) < self.read_at_ns - _SETTLE_NS


class SpecDirs:
    """The spec dirs of one process, read again only where something changed. Not thread-safe: one owner."""

    def __init__(self, dirs: Sequence[pathlib.Path], clock: Callable[[], int] = time.time_ns):
        # A directory listed twice is read once, at its first place: the runtime would read it twice and
        # never see a conflict between a file and itself.
        self.dirs = tuple(dict.fromkeys(os.path.normpath(d) for d in dirs))
        self._clock = clock  # wall clock, ns: the file system's times are compared with it
        self._listings: dict[str, tuple[_Cached, tuple[str, ...], str | None]] = {}
        self._specs: dict[str, tuple[_Cached, LoadedSpec]] = {}

    def _names(self, directory: str) -> tuple[tuple[str, ...], str | None]:
        """The spec file names of a directory (from the last listing while its mtime holds) and a problem."""
        try:
            key = _file_key(os.stat(directory))
        except FileNotFoundError:
            self._listings.pop(directory, None)
            return (), None  # a missing dir holds no spec, as for the runtime
        except OSError as exc:
            return (), f"{directory}: {exc.strerror or exc}"
        cached = self._listings.get(directory)
        if cached is not None and cached[0].still(key):
            return cached[1], cached[2]
        listed_at = self._clock()
        try:
            with os.scandir(directory) as entries:
                names = sorted(entry.name for entry in entries if entry.name.endswith(SPEC_SUFFIXES)
                               and not entry.is_dir(follow_symlinks=False))
        except OSError as exc:
            return (), f"{directory}: {exc.strerror or exc}"
        problem = None
        if len(names) > MAX_SPECS_PER_DIR:
            problem = f"{directory}: {len(names)} spec files, only the first {MAX_SPECS_PER_DIR} are read"
            names = names[:MAX_SPECS_PER_DIR]
        self._listings[directory] = (_Cached(key, listed_at), tuple(names), problem)
        return tuple(names), problem

    def read(self) -> DirsView:
        specs: list[LoadedSpec] = []
        problems: list[str] = []
        seen: dict[str, tuple[_Cached, LoadedSpec]] = {}
        for index, directory in enumerate(self.dirs):
            names, problem = self._names(directory)
            if problem is not None:
                problems.append(problem)
            for name in names:
                path = os.path.join(directory, name)
                try:
                    key = _file_key(os.stat(path))
                except OSError:
                    key = (0, 0, 0, 0, 0)  # gone or unreadable: read_spec says which, every time
                cached = self._specs.get(path)
                if cached is not None and key[1] and cached[0].still(key):
                    seen[path] = cached
                else:
                    seen[path] = (_Cached(key, self._clock()), read_spec(path, index))
                specs.append(seen[path][1])
        self._specs = seen
        return DirsView(tuple(specs), tuple(problems))
