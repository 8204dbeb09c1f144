"""The per-tenant NCCL env files on this node, as data: which files are wanted, which were found, whose they are.

The daemon keeps ``<run>/shaperd/nccl/<tenant>.env`` (Roots.run) for hostPath
mounts and bare-metal launchers. Wanted: every tenant on a node that has an
RDMA device (a launcher can rely on its file being there), and elsewhere the
tenants whose ``rdma`` section sets something. Ownership: shaperd owns a file
in that directory only when its name is ``<tenant name>.env``, it is a regular
file (not a symlink), and its first line is shaperd's header
(``nccl.header``); anything else there is never touched. Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from shaperd.core.config import Config, Rdma
from shaperd.core.inventory import Inventory
from shaperd.rdma import nccl
from shaperd.rdma.plan import RdmaPlan

SUBDIR = ("shaperd", "nccl")  # under Roots.run
SUFFIX = ".env"
# A tenant name (config.model.NAME_RE) followed by .env.
FILE_RE = re.compile(r"^(?P<tenant>[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)\.env$")


@dataclass(frozen=True)
class EnvFile:
    tenant: str
    content: bytes

    @property
    def name(self) -> str:
        return self.tenant + SUFFIX


@dataclass(frozen=True)
class NcclFiles:
    """The RDMA backend's desired state: one env file per wanted tenant."""

    files: tuple[EnvFile, ...] = ()
    problems: tuple = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class EnvObserved:
    directory: str
    files: dict[str, bytes] = field(default_factory=dict)  # file name -> content, shaperd's files only
    foreign: frozenset[str] = frozenset()  # <tenant>.env names that are not shaperd's
    error: str | None = None  # the directory could not be read


def tenant_of(name: str) -> str | None:
    m = FILE_RE.match(name)
    return m["tenant"] if m else None


def owned(name: str, first_line: bytes) -> bool:
    """A regular file's name and first line (without its newline) say it is shaperd's."""
    tenant = tenant_of(name)
    return tenant is not None and first_line == nccl.header(tenant).encode()


def wanted(cfg: Config, inv: Inventory, plan: RdmaPlan) -> NcclFiles:
    rdma_node = bool(inv.rdma)
    files = []
    for t in plan.tenants:
        if rdma_node or t.ports or cfg.tenant(t.tenant).rdma != Rdma():
            files.append(EnvFile(t.tenant, nccl.env_file(nccl.tenant_env(t))))
    return NcclFiles(files=tuple(files), warnings=plan.warnings)
