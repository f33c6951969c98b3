"""What the stack's processes share, by concern; each subpackage's docstring says what it owns, and its
`MAY_IMPORT` which other parts of shared/ it may import (tests/unit/test_layers.py holds them to it):

- the vocabulary, here at the top: `config` (every setting), `durations`, `programs` (the program names),
  `resources` (the three resources), `version`;
- `fs`: small file-system helpers (the one atomic writer, safe opening, the one door to inotify);
- `node`: the node and its tools (sysfs, the driver's status files, device nodes, rbln-smi, RSD groups, health);
- `channels`: what passes between the stack's processes (the inventory protocol and its subscriber, the
  status files and their records);
- `observability`: logs, metrics and traces;
- `cdi`: Container Device Interface specs;
- `supervision`: supervisord's client and what every process does at start and at shutdown;
- `kubelet`: the kubelet's gRPC APIs (generated stubs) and the plugin sockets in its directory;
- `fence`: the workarounds that reach into a dependency's internals.

The vocabulary may import the names it checks settings against (socket names, the CDI annotation modes).
"""

MAY_IMPORT = ("shared.cdi", "shared.channels", "shared.kubelet")
