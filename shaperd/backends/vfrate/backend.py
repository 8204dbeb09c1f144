"""The vfrate backend: the protocol's steps for SR-IOV VF rates on the PFs of the tenants' VFs.

Owns the min/max tx rate of VFs that belong to a tenant of the tenants file
(their RDMA device is one of the tenant's), and of VFs this agent set and no
tenant owns any more while they still carry what it set (reset to 0/0). It
reads other VFs of the same PF and leaves them.

Drivers differ: mlx5 takes both rates; ice refuses a minimum while DCB is
on; i40e and ixgbe refuse any minimum (EINVAL). A minimum the driver
refuses (EINVAL or EOPNOTSUPP) is recorded per (PF, driver): the write is
sent again once at once with min 0 (limit only), one warning is logged,
and every later plan gives that PF's VFs min 0 until the tenants file
changes or the agent restarts, so a refused write is never re-sent. A PF
that refuses even the limit is recorded the same way and left out.
``status()`` shows both. The kernel side (kernel/vf.py) is injectable: tests
drive this backend with a fake NIC.

What it set is recorded in ``state_file`` (``<run>/shaperd/vfrate-owned.json``:
PF netdev, VF, the rates written), so a restarted agent and ``shaperd
teardown`` know which VFs are shaperd's to reset. /run is cleared at boot,
when VFs are re-created without rates anyway. An unreadable record is logged
and treated as empty: then nothing is reset (never a foreign VF).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from shaperd.core import log
from shaperd.core.atomicfile import write_atomic
from shaperd.core.errors import KernelError
from shaperd.core.inventory import Capabilities, Inventory
from shaperd.core.protocol import ApplyResult, BackendStats, PlanInput, Support, TargetDiff
from shaperd.rdma import plan as rdma_plan
from shaperd.backends.vfrate import plan as vf_plan
from shaperd.backends.vfrate.diff import VfObserved, diff, teardown
from shaperd.backends.vfrate.ops import SetVfRate
from shaperd.backends.vfrate.plan import VfPlan
from shaperd.backends.vfrate.render import render as render_plan


@dataclass
class VfSnapshot:
    """The last reconcile's VF rates, for status and metrics: wanted, and as the PFs reported them."""

    desired: VfPlan = field(default_factory=VfPlan)
    observed: VfObserved = field(default_factory=VfObserved)


class _Kernel:
    """The real kernel side (kernel/vf.py), imported late so pure tests need no pyroute2 socket."""

    def read(self, reads, ifindex: int, device: str):
        from shaperd.backends.vfrate import kernel as vf

        return vf.read_pf(reads, ifindex, device)

    def write(self, writer, ops: list[SetVfRate]) -> ApplyResult:
        from shaperd.backends.vfrate import kernel as vf

        return vf.apply_ops(writer, ops)

    @property
    def refused_errnos(self) -> frozenset[int]:
        from shaperd.backends.vfrate import kernel as vf

        return vf.REFUSED_ERRNOS


class VfRateBackend:
    name = "vfrate"
    # What may be left on a PF a teardown could not read (engine/teardown.py words the failure).
    teardown_remains = "the VF rates shaperd set"

    def __init__(self, writer, kernel=None, state_file: Path | None = None):
        self.writer = writer
        self.state_file = state_file
        self.kernel = kernel if kernel is not None else _Kernel()
        self.log = log.get("shaperd.vfrate")
        # (PF PCI, driver) -> the kernel's answer to a minimum / to any rate; kept until the config changes.
        self.refused_min: dict[tuple[str, str], str] = {}
        self.unsupported: dict[tuple[str, str], str] = {}
        # (PF netdev, VF) -> (min, max) Mbit/s this agent wrote and saw land: what it may reset.
        self.ours: dict[tuple[str, int], tuple[int, int]] = self._load()
        self._config_key: str | None = None
        self.snapshot = VfSnapshot()

    def probe(self, caps: Capabilities) -> Support:
        return Support(True)  # a node without SR-IOV VFs plans nothing and reads nothing

    def plan(self, ctx: PlanInput) -> VfPlan:
        key = repr((ctx.config.node, ctx.config.tenants))
        if key != self._config_key:
            if self._config_key is not None and (self.refused_min or self.unsupported):
                self.log.info("tenants file changed: refused VF rates will be tried again")
            had = bool(self.refused_min or self.unsupported)
            self.refused_min.clear()
            self.unsupported.clear()
            self._config_key = key
            if had:
                self._save()
        rp = rdma_plan.plan(ctx.config, ctx.inventory, ctx.tenancy)
        p = vf_plan.plan(ctx.config, ctx.inventory, rp, self.refused_min, self.unsupported)
        self.snapshot = VfSnapshot(p, self.snapshot.observed)
        return p

    def adopt_refusals(self, cfg, refusals: dict[tuple[str, str], dict]) -> None:
        """Plan ``cfg`` as an agent that met these refusals (read_refusals) would (``shaperd rdma vf-rates``)."""
        self.refused_min = {k: v["min"] for k, v in refusals.items() if "min" in v}
        self.unsupported = {k: v["all"] for k, v in refusals.items() if "all" in v}
        self._config_key = repr((cfg.node, cfg.tenants))

    def observe(self, reads, inv: Inventory) -> VfObserved:
        ifindex = {l.name: l.ifindex for l in inv.links}
        want = {v.pf: v.pf_ifindex for v in self.snapshot.desired.vfs}
        for pf, _ in self.ours:
            if pf in ifindex:
                want.setdefault(pf, ifindex[pf])
        out = VfObserved(ifindexes=dict(want))
        for pf, idx in sorted(want.items()):
            try:
                st = self.kernel.read(reads, idx, pf)
            except KernelError as e:
                out.errors[pf] = str(e)
                continue
            if st is not None:
                out.pfs[pf] = st
        self.snapshot = VfSnapshot(self.snapshot.desired, out)
        self._forget_changed(out)
        return out

    def _forget_changed(self, observed: VfObserved) -> None:
        """A VF no tenant wants whose rates someone changed since shaperd set them is not shaperd's any more."""
        wanted = {v.key for v in self.snapshot.desired.vfs}
        gone = []
        for (pf, n), (lo, hi) in self.ours.items():
            st = observed.pfs.get(pf)
            row = st.vf(n) if st is not None and st.reported else None
            if (pf, n) in wanted or row is None:
                continue
            if row.max_mbps != hi or row.min_mbps not in (None, lo):
                gone.append((pf, n))
                self.log.info("VF rates changed by someone else since shaperd set them: left alone, not shaperd's "
                              "any more", device=pf, vf=n)
        for k in gone:
            del self.ours[k]
        if gone:
            self._save()

    def diff(self, desired: VfPlan, observed: VfObserved) -> list[TargetDiff]:
        return diff(desired, observed, self.ours)

    def apply(self, td: TargetDiff, batch: bool = True) -> ApplyResult:
        """One write at a time (``batch`` ignored): what the driver refuses is known before the next VF's write."""
        out = ApplyResult()
        state = (dict(self.ours), dict(self.refused_min), dict(self.unsupported))
        for op in td.ops:
            key = (op.pf_pci, op.driver)
            if op.tenant is not None and key in self.unsupported:
                out.failed.append((op, op.error(f"not sent: the driver refused VF rates here ({self.unsupported[key]})")))
                continue
            if op.tenant is not None and op.min_mbps > 0 and key in self.refused_min:
                op = self._limit_only(op, self.refused_min[key])
            res = self.kernel.write(self.writer, [op])
            out.applied.extend(res.applied)
            for op1, err in res.failed:
                if err.errno not in self.kernel.refused_errnos or op1.tenant is None:
                    out.failed.append((op1, err))
                elif op1.min_mbps > 0:
                    self.refused_min[key] = err.cause
                    self.log.warning("driver refused a VF minimum rate: this PF gets the limit only (min_tx_rate 0) "
                                     "until the tenants file changes", device=op1.device, driver=op1.driver,
                                     vf=op1.vf, error=str(err), min_rate_supported=False)
                    again = self.kernel.write(self.writer, [self._limit_only(op1, err.cause)])
                    out.applied.extend(again.applied)
                    for op2, err2 in again.failed:
                        self._refused_all(op2, err2, out)
                else:
                    self._refused_all(op1, err, out)
        for op in out.applied:
            if (op.min_mbps, op.max_mbps) == (0, 0) and op.tenant is None:
                self.ours.pop((op.device, op.vf), None)
            else:
                self.ours[(op.device, op.vf)] = (op.min_mbps, op.max_mbps)
        if (self.ours, self.refused_min, self.unsupported) != state:
            self._save()
        return out

    # -- the record of what this agent set -------------------------------------
    def _load(self) -> dict[tuple[str, int], tuple[int, int]]:
        if self.state_file is None:
            return {}
        try:
            doc = json.loads(Path(self.state_file).read_text())
            return {(e["pf"], int(e["vf"])): (int(e["min_mbps"]), int(e["max_mbps"])) for e in doc["vfs"]}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as e:
            self.log.warning("VF rate record unreadable: no VF will be reset until shaperd sets it again",
                             file=str(self.state_file), error=str(e))
            return {}

    def _save(self) -> None:
        if self.state_file is None:
            return
        # The refusals are written for `shaperd rdma vf-rates` to show; a restarted agent does not load them
        # (it tries the minimum once more).
        doc = {"version": 1, "vfs": [{"pf": pf, "vf": n, "min_mbps": lo, "max_mbps": hi}
                                     for (pf, n), (lo, hi) in sorted(self.ours.items())],
               "refused_min": [{"pf_pci": k[0], "driver": k[1], "reason": v} for k, v in sorted(self.refused_min.items())],
               "unsupported": [{"pf_pci": k[0], "driver": k[1], "reason": v} for k, v in sorted(self.unsupported.items())]}
        try:
            os.makedirs(Path(self.state_file).parent, mode=0o755, exist_ok=True)
            write_atomic(Path(self.state_file), (json.dumps(doc, indent=1) + "\n").encode(), 0o644)
        except OSError as e:
            self.log.warning("VF rate record not written: a restarted agent will not reset these VFs",
                             file=str(self.state_file), error=e.strerror or str(e))

    @staticmethod
    def _limit_only(op: SetVfRate, cause: str) -> SetVfRate:
        return SetVfRate(**{**_fields(op), "min_mbps": 0,
                            "reason": f"limit only: the driver refused min {op.min_mbps} Mbit/s ({cause})"})

    def _refused_all(self, op: SetVfRate, err: KernelError, out: ApplyResult) -> None:
        out.failed.append((op, err))
        if err.errno in self.kernel.refused_errnos:
            self.unsupported[(op.pf_pci, op.driver)] = err.cause
            self.log.warning("driver refused VF rates: this PF's VFs are left out until the tenants file changes",
                             device=op.device, driver=op.driver, vf=op.vf, error=str(err))

    def teardown(self, observed: VfObserved) -> list[TargetDiff]:
        return teardown(observed, self.ours)

    def stats(self, desired: VfPlan) -> BackendStats:
        return BackendStats(devices=desired.pfs)

    def render(self, desired: VfPlan) -> str:
        return render_plan(desired)

    def status(self) -> dict:
        """Per PF: whether its driver takes a minimum rate, and why not (for `shaperd status` and logs)."""
        out = {}
        for v in self.snapshot.desired.vfs:
            pf = out.setdefault(v.pf, {"driver": v.driver, "min_rate_supported": True, "reason": None})
            if (v.pf_pci, v.driver) in self.refused_min:
                pf["min_rate_supported"], pf["reason"] = False, self.refused_min[(v.pf_pci, v.driver)]
        for pf, why in self.snapshot.desired.unsupported.items():
            out[pf] = {"driver": None, "min_rate_supported": False, "rates_supported": False, "reason": why}
        return out


def read_refusals(state_file: Path) -> dict[tuple[str, str], dict]:
    """What the running agent recorded as refused, per (PF PCI, driver): {"min": reason, "all": reason}; {} if none."""
    try:
        doc = json.loads(Path(state_file).read_text())
        out: dict[tuple[str, str], dict] = {}
        for kind, name in (("refused_min", "min"), ("unsupported", "all")):
            for e in doc.get(kind, ()):
                out.setdefault((e["pf_pci"], e["driver"]), {})[name] = e["reason"]
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _fields(op: SetVfRate) -> dict:
    return {k: getattr(op, k) for k in ("device", "ifindex", "reason", "tenant", "vf", "min_mbps", "max_mbps",
                                        "pf_pci", "driver")}
