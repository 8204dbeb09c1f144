"""Filesystem roots: where /sys, /proc, /run, the kubelet's directory, the bpffs and /lib/modules are, in one object.

Every reader of sysfs, procfs, cgroups, named network namespaces and the
kubelet's sockets takes its paths from a Roots, so tests (and an agent in a
container with the host's trees mounted elsewhere) point all of them at
another tree at once. Pure: it only joins paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Roots:
    sys: Path = Path("/sys")
    proc: Path = Path("/proc")
    run: Path = Path("/run")
    kubelet: Path = Path("/var/lib/kubelet")
    # The bpffs under which shaperd pins its classifier (in <bpffs>/shaperd/ only).
    bpffs: Path = Path("/sys/fs/bpf")
    # The kernel's module tree (modules.builtin, modules.dep per release) and its config files: evidence of
    # which qdisc kinds the kernel has where no probe namespace can test them (kernel/qdisc_kinds.py).
    modules: Path = Path("/lib/modules")
    boot: Path = Path("/boot")

    @classmethod
    def of(cls, sys="/sys", proc="/proc", run="/run", kubelet="/var/lib/kubelet", bpffs="/sys/fs/bpf",
           modules="/lib/modules", boot="/boot") -> "Roots":
        return cls(Path(sys), Path(proc), Path(run), Path(kubelet), Path(bpffs), Path(modules), Path(boot))

    def net_class(self, ifname: str) -> Path:
        """/sys/class/net/<ifname>."""
        return self.sys / "class" / "net" / ifname

    @property
    def mountinfo(self) -> Path:
        return self.proc / "self" / "mountinfo"

    @property
    def infiniband(self) -> Path:
        return self.sys / "class" / "infiniband"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet / "pod-resources" / "kubelet.sock"

    def host(self, path: str | Path) -> Path:
        """A host path (as mountinfo or the kernel names it) under these roots."""
        p = Path(path)
        for top, root in ((Path("/sys"), self.sys), (Path("/proc"), self.proc), (Path("/run"), self.run)):
            if p == top or top in p.parents:
                return root / p.relative_to(top)
        return p


DEFAULT = Roots()
