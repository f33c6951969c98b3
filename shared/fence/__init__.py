"""The fence: every piece of the product that reaches into a dependency's internals, and nothing else.

Each module here works around something its dependency offers no public way to do, and says in its
docstring what it buys (measured on the stack as a node runs it), the exact version of the dependency it was
checked against (its `CHECKED_AGAINST`), and what happens on another version. That version is pinned exactly
in pyproject.toml and deploy/container/requirements.lock, and tests/unit/test_fence.py fails when the
installed version differs from it: whoever moves the pin reads the dependency's new internals first.

A module here is imported only where its workaround is installed, and each is self-contained, so that
dropping one (when what it buys no longer pays) is deleting it and its callers' lines. May import
`observability` (the metric kinds the value files carry).
"""

MAY_IMPORT = ("shared.observability",)
