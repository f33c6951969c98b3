"""CDI spec housekeeping: transient specs a previous instance may have left behind."""

from __future__ import annotations

import pathlib

from loguru import logger

TRANSIENT_SPEC_PREFIX = "rebellions.ai-npu_"


def remove_stale_specs(cdi_root: pathlib.Path) -> list[pathlib.Path]:
    """Delete `rebellions.ai-npu_*` files in the CDI root; a missing root is fine. Returns what was removed."""
    removed: list[pathlib.Path] = []
    try:
        candidates = [p for p in cdi_root.iterdir() if p.name.startswith(TRANSIENT_SPEC_PREFIX)]
    except FileNotFoundError:
        return removed
    except OSError as exc:
        logger.warning("Cannot list the CDI spec directory", path=str(cdi_root), err=str(exc))
        return removed
    for path in candidates:
        try:
            if path.is_file() or path.is_symlink():
                path.unlink()
                removed.append(path)
        except OSError as exc:
            logger.warning("Cannot remove a stale CDI spec", path=str(path), err=str(exc))
    if removed:
        logger.info("Removed stale CDI specs", paths=[str(p) for p in removed])
    return removed
