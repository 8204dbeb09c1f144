"""The RDMA backend's typed operations: write or delete one tenant's NCCL env file. Pure: no I/O.

``device`` is the env file directory (``<run>/shaperd/nccl``), so descriptions
and errors read "write NCCL env file tenant-a.env on /run/shaperd/nccl: ...".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shaperd.core.protocol import Operation
from shaperd.backends.nccl.envfiles import EnvFile


@dataclass(frozen=True, kw_only=True)
class WriteEnvFile(Operation):
    """Create or replace the file, atomically (a reader sees the old content or the new, never half)."""

    file: EnvFile
    verb: ClassVar[str] = "write"

    def what(self) -> str:
        return f"NCCL env file {self.file.name}"


@dataclass(frozen=True, kw_only=True)
class DeleteEnvFile(Operation):
    name: str
    verb: ClassVar[str] = "delete"

    def what(self) -> str:
        return f"NCCL env file {self.name}"
