"""What passes between the stack's processes: the scanner's inventory over ZeroMQ (`inventory_protocol`) and
its `inventory_subscriber`, and the status files each process keeps in the run dir (`status_files`) with
their typed records (`status_records`). May import the vocabulary, `fs` and `node` (what an inventory holds)."""

MAY_IMPORT = ("shared", "shared.fs", "shared.node")
