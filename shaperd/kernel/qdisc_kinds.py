"""Evidence, from files only, of which tc kinds the running kernel has: present | absent | unknown.

The capability probe tests qdisc kinds for real in a throwaway network
namespace, which needs CAP_SYS_ADMIN. The DaemonSet and the systemd unit grant
NET_ADMIN + BPF only, so there the probe reads what the kernel's own files say
instead of assuming (kernel/probe.py ``_assumed``). Per module, in this order:

1. ``sch_mq``: always present. net/sched/sch_mq.o is ``obj-y`` beside
   sch_generic.o (not a tristate option), so every kernel with a packet
   scheduler has it;
2. ``/proc/modules`` lists it: loaded now;
3. ``/sys/module/<name>`` exists: loaded, or built in with parameters;
4. ``<modules root>/<release>/modules.builtin`` lists it: built in;
   ``modules.dep`` lists it (``.ko``, ``.ko.xz``, ``.ko.zst``, ``.ko.gz``):
   loadable (the kernel loads it itself on first use, through its modprobe
   helper on the host's filesystem, which is why a pod needs the host's
   /lib/modules only as evidence);
5. both of those files readable and neither lists it: absent (they are
   written by the build of exactly this release);
6. the kernel config (``<boot>/config-<release>``, else
   ``/proc/config.gz``): ``=y`` built in, ``=m`` a module, ``is not set``
   (or no line, or ``CONFIG_MODULES`` not set and not ``=y``) absent;
7. otherwise unknown: offered, and verified when first applied
   (backends/edt/refusals.py).

Read-only, through Roots (fixture trees in tests); never loads a module,
never raises (an unreadable file is no evidence).
"""

from __future__ import annotations

import gzip
import os
import re
from dataclasses import dataclass

from shaperd.core.roots import Roots

PRESENT, ABSENT, UNKNOWN = "present", "absent", "unknown"
# module name -> its Kconfig symbol (None: not a tristate option).
KINDS: dict[str, str | None] = {
    "sch_fq": "CONFIG_NET_SCH_FQ",
    "sch_mq": None,
    "sch_htb": "CONFIG_NET_SCH_HTB",
    "cls_bpf": "CONFIG_NET_CLS_BPF",
    "cls_u32": "CONFIG_NET_CLS_U32",
    # The tenant-ingress path (backends/ingress): the IFB device and the mirred action that feeds it.
    "ifb": "CONFIG_IFB",
    "act_mirred": "CONFIG_NET_ACT_MIRRED",
}
_KO = re.compile(r"\.ko(\.(xz|zst|gz))?$")
_MAX_FILE_BYTES = 16 << 20  # modules.dep of a distribution kernel is ~1 MiB; a bound, not a limit expected to bite


@dataclass(frozen=True)
class KindEvidence:
    module: str  # e.g. "sch_fq"
    state: str  # PRESENT | ABSENT | UNKNOWN
    evidence: str  # what says so, naming the file and the release

    def __str__(self) -> str:
        return f"{self.module} {self.state}: {self.evidence}"


def release(roots: Roots) -> str:
    """The running kernel's release (/proc/sys/kernel/osrelease, else uname)."""
    text = _read(roots.proc / "sys" / "kernel" / "osrelease")
    return text.strip() if text else os.uname().release


def evidence_all(roots: Roots, modules: tuple[str, ...] = tuple(KINDS)) -> dict[str, KindEvidence]:
    rel = release(roots)
    files = _Files(roots, rel)
    return {m: evidence(m, files) for m in modules}


def evidence(module: str, files: "_Files") -> KindEvidence:
    rel = files.release
    if module == "sch_mq":
        return KindEvidence(module, PRESENT, "built into the core packet scheduler (sch_mq.o is obj-y, not a module)")
    if module in files.loaded():
        return KindEvidence(module, PRESENT, f"loaded ({files.roots.proc}/modules)")
    if (files.roots.sys / "module" / module).is_dir():
        return KindEvidence(module, PRESENT, f"{files.roots.sys}/module/{module} exists (loaded or built in)")
    builtin, dep = files.modules_list("modules.builtin"), files.modules_list("modules.dep")
    if builtin is not None and module in builtin:
        return KindEvidence(module, PRESENT, f"built in (modules.builtin of {rel})")
    if dep is not None and module in dep:
        return KindEvidence(module, PRESENT, f"loadable (modules.dep of {rel})")
    if builtin is not None and dep is not None:
        return KindEvidence(module, ABSENT, f"not in modules.builtin or modules.dep of {rel}")
    return _from_config(module, files)


def _from_config(module: str, files: "_Files") -> KindEvidence:
    symbol = KINDS.get(module)
    cfg = files.config()
    if cfg is None or symbol is None:
        return KindEvidence(module, UNKNOWN, f"no modules.builtin/modules.dep of {files.release} under "
                                             f"{files.roots.modules} and no kernel config to read")
    where, values = cfg
    value = values.get(symbol)
    if value == "y":
        return KindEvidence(module, PRESENT, f"built in ({symbol}=y in {where})")
    if value == "m" and values.get("CONFIG_MODULES") == "y":
        return KindEvidence(module, PRESENT, f"a module ({symbol}=m in {where})")
    if value == "m":
        return KindEvidence(module, ABSENT, f"{symbol}=m but CONFIG_MODULES is not set in {where}")
    return KindEvidence(module, ABSENT, f"{symbol} is not set in {where} (kernel {files.release})")


class _Files:
    """The evidence files of one release, each read at most once."""

    def __init__(self, roots: Roots, rel: str):
        self.roots, self.release = roots, rel
        self._cache: dict[str, object] = {}

    def loaded(self) -> set[str]:
        if "loaded" not in self._cache:
            text = _read(self.roots.proc / "modules") or ""
            self._cache["loaded"] = {line.split(" ", 1)[0] for line in text.splitlines() if line}
        return self._cache["loaded"]  # type: ignore[return-value]

    def modules_list(self, name: str) -> set[str] | None:
        """Module names in modules.builtin / modules.dep ("kernel/net/sched/sch_fq.ko: deps" -> sch_fq)."""
        if name not in self._cache:
            text = _read(self.roots.modules / self.release / name)
            names = None
            if text is not None:
                names = set()
                for line in text.splitlines():
                    path = line.split(":", 1)[0].strip()
                    base = _KO.sub("", path.rsplit("/", 1)[-1])
                    if base:
                        names.add(base.replace("-", "_"))
            self._cache[name] = names
        return self._cache[name]  # type: ignore[return-value]

    def config(self) -> tuple[str, dict[str, str]] | None:
        """(where, CONFIG_X -> value) from <boot>/config-<release>, else <proc>/config.gz."""
        if "config" not in self._cache:
            found = None
            boot = self.roots.boot / f"config-{self.release}"
            text = _read(boot)
            where = str(boot)
            if text is None:
                text, where = _read_gz(self.roots.proc / "config.gz"), str(self.roots.proc / "config.gz")
            if text:  # an empty file says nothing (not "every option unset")
                values = {}
                for line in text.splitlines():
                    if line.startswith("CONFIG_") and "=" in line:
                        k, v = line.split("=", 1)
                        values[k] = v.strip()
                found = (where, values)
            self._cache["config"] = found
        return self._cache["config"]  # type: ignore[return-value]


def _read(path) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(_MAX_FILE_BYTES).decode("utf-8", "replace")
    except OSError:
        return None


def _read_gz(path) -> str | None:
    try:
        with gzip.open(path, "rb") as f:
            return f.read(_MAX_FILE_BYTES).decode("utf-8", "replace")
    except (OSError, EOFError):
        return None
