"""The three extended resources this plugin advertises, and the names derived from them."""

from __future__ import annotations

import enum
import re


class Resource(enum.Enum):
    NPU = "rebellions.ai/npu"
    NPU_VF1 = "rebellions.ai/npu-vf1"
    NPU_VF4 = "rebellions.ai/npu-vf4"

    @property
    def short_name(self) -> str:
        """`npu`, `npu-vf1`, `npu-vf4`."""
        return self.value.split("/", 1)[1]

    @property
    def process_name(self) -> str:
        """The supervisord program name and the `process` log key of its worker."""
        return f"worker-{self.short_name}"

    @property
    def slug(self) -> str:
        """`rebellions-ai-npu-vf4`: the resource name made safe for a file name."""
        return re.sub(r"[/._]", "-", self.value.lower())

    @classmethod
    def for_vf_count(cls, num_vfs: int) -> Resource | None:
        """The VF resource of a PF partitioned into `num_vfs` VFs; None when unsupported."""
        return {1: cls.NPU_VF1, 4: cls.NPU_VF4}.get(num_vfs)

    @classmethod
    def from_process_name(cls, process_name: str) -> Resource:
        for resource in cls:
            if resource.process_name == process_name:
                return resource
        raise ValueError(f"no resource has a worker named {process_name!r}")
