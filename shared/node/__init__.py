"""The node and its tools: what sysfs and the driver say of each device (its record, its SR-IOV role, the
driver's status file and the health policy on it), the device nodes a container gets, `rbln-smi` and the
RSD groups made with it. May import the vocabulary and `fs`."""

MAY_IMPORT = ("shared", "shared.fs")
