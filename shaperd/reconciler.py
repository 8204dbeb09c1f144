"""One reconcile: discover -> plan -> read -> diff -> apply, per device.

The single writer of tc state. Each device is handled on its own: a foreign
qdisc, a missing capacity or a netlink error on one device is reported and
never stops enforcement on the others. Devices that still carry shaperd's
tree but are no longer selected are torn down (garbage collection).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from . import log
from .config import Config
from .diff import DeviceDiff, Op, diff_device, diff_teardown
from .errors import ConfigProblem, KernelError
from .inventory import Capabilities, Inventory
from .kernel import tc
from .planner import HtbSettings, Plan, plan
from .discovery import cgroups as cgroups_mod
from .discovery import pods as pods_mod
from .discovery.node import discover
from .diff import diff_marks


# Pseudo-device name for the mark programs on host-side pod interfaces.
MARKS = "(pod interfaces)"


@dataclass
class DeviceOutcome:
    device: str
    ops: list[Op] = field(default_factory=list)  # planned (diff) or applied (apply)
    failed: list[tuple[Op, KernelError]] = field(default_factory=list)
    blocked: str | None = None
    error: str | None = None  # the device could not be read at all


@dataclass
class Report:
    plan: Plan
    devices: list[DeviceOutcome] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def changes(self) -> int:
        return sum(len(d.ops) for d in self.devices)

    @property
    def problems(self) -> tuple[ConfigProblem, ...]:
        return self.plan.problems

    @property
    def ok(self) -> bool:
        return not self.plan.problems and not any(d.failed or d.error or d.blocked for d in self.devices)


class Reconciler:
    def __init__(
        self,
        ipr,
        capabilities: Capabilities,
        take_over: bool = False,
        sysfs_root: str = "/sys",
        settings: HtbSettings = HtbSettings(),
        pods_source=None,
        cgroup_root=None,
        *,
        reader,
    ):
        self.ipr = ipr  # writes (pyroute2)
        # Reads: a raw rtnetlink reader (kernel/tcstats.py), required and in the same
        # namespace as ipr: a default here once silently read one namespace and wrote another.
        self.reader = reader
        self.capabilities = capabilities
        self.take_over = take_over
        self.sysfs_root = sysfs_root
        self.settings = settings
        # Callable returning the pods on this node (PodInfo-like objects), or None without Kubernetes.
        self.pods_source = pods_source
        self.cgroup_root = cgroup_root if cgroup_root is not None else cgroups_mod.cgroup2_root()
        self.log = log.get("shaperd.reconcile")

    def inventory(self, cfg: Config | None = None) -> Inventory:
        inv = discover(self.reader, self.capabilities, self.sysfs_root)
        pods = ()
        if self.pods_source is not None:
            pods = pods_mod.resolve(self.reader, list(self.pods_source()), inv.links, self.cgroup_root)
        refs = []
        if cfg is not None and self.cgroup_root is not None:
            for t in cfg.tenants:
                for path in t.match.cgroups:
                    r = cgroups_mod.ref(self.cgroup_root, path)
                    if r is None:
                        self.log.warning("cgroup not found", tenant=t.name, cgroup=path, root=str(self.cgroup_root))
                    else:
                        refs.append(r)
        return Inventory(links=inv.links, default_route_devices=inv.default_route_devices,
                         capabilities=inv.capabilities, pods=pods, cgroups=tuple(refs))

    def plan(self, cfg: Config, inv: Inventory | None = None) -> Plan:
        return plan(cfg, inv or self.inventory(cfg), self.settings)

    def _diffs(self, cfg: Config) -> tuple[Plan, list[tuple[DeviceDiff | None, DeviceOutcome]]]:
        inv = self.inventory(cfg)
        p = self.plan(cfg, inv)
        take_over = self.take_over or cfg.node.take_over
        out: list[tuple[DeviceDiff | None, DeviceOutcome]] = []
        try:
            qdiscs = self.reader.qdiscs()  # one dump of every qdisc serves all devices, GC and marks
        except KernelError as e:
            return p, [(None, DeviceOutcome("node", error=str(e)))]
        for dp in p.devices:
            outcome = DeviceOutcome(dp.device)
            try:
                observed = self.reader.device_state(dp.device, dp.ifindex, qdiscs)
            except KernelError as e:
                outcome.error = str(e)
                out.append((None, outcome))
                continue
            d = diff_device(dp, observed, take_over)
            outcome.blocked = d.blocked
            out.append((d, outcome))
        # Garbage: our tree on devices no longer selected (not on those merely failing to plan).
        keep = {dp.device for dp in p.devices} | set(p.skipped)
        for ifindex, name in self._owned_devices(inv, qdiscs):
            if name not in keep:
                op = Op("delete-root", name, ifindex, None, "device no longer selected by node.interfaces")
                out.append((DeviceDiff(name, [op]), DeviceOutcome(name)))
        # Marks on host-side pod interfaces.
        names = {l.ifindex: l.name for l in inv.links}
        try:
            observed, clsact = self.reader.marks(qdiscs)
            mark_ops = diff_marks(p.marks, observed, clsact, names)
            out.append((DeviceDiff(MARKS, mark_ops), DeviceOutcome(MARKS)))
        except KernelError as e:
            out.append((None, DeviceOutcome(MARKS, error=str(e))))
        return p, out

    def _owned_devices(self, inv: Inventory, qdiscs=None) -> list[tuple[int, str]]:
        names = {l.ifindex: l.name for l in inv.links}
        return [(i, names[i]) for i in sorted(self.reader.owned(qdiscs)) if i in names]

    def diff(self, cfg: Config) -> Report:
        start = time.perf_counter()
        p, diffs = self._diffs(cfg)
        for d, outcome in diffs:
            if d is not None:
                outcome.ops = list(d.ops)
        return Report(plan=p, devices=[o for _, o in diffs], duration_s=time.perf_counter() - start)

    def apply(self, cfg: Config) -> Report:
        start = time.perf_counter()
        p, diffs = self._diffs(cfg)
        dp_by_name = {dp.device: dp for dp in p.devices}
        for d, outcome in diffs:
            if d is None or not d.ops:
                continue
            res = tc.apply_ops(self.ipr, d.ops)
            if res.batch_failed:
                # Some writes may have landed: read again, diff again, then one by one.
                res = self._retry_one_by_one(d, dp_by_name.get(d.device), cfg)
            outcome.ops, outcome.failed = res.applied, res.failed
            for op in res.applied:
                self.log.info("kernel change", device=op.device, tenant=op.tenant, change=op.describe())
            for op, err in res.failed:
                self.log.error("kernel write failed", device=op.device, tenant=op.tenant, error=str(err))
        for pr in p.problems:
            self.log.error("device not shaped", problem=str(pr))
        for w in p.warnings:
            self.log.warning("plan warning", warning=w)
        for _, outcome in diffs:
            if outcome.blocked:
                self.log.warning("device left alone", device=outcome.device, reason=outcome.blocked)
            if outcome.error:
                self.log.error("device not readable", device=outcome.device, error=outcome.error)
        return Report(plan=p, devices=[o for _, o in diffs], duration_s=time.perf_counter() - start)

    def _retry_one_by_one(self, d: DeviceDiff, dp, cfg: Config) -> tc.ApplyResult:
        if d.device == MARKS:
            observed, clsact = self.reader.marks()
            p = self.plan(cfg)
            names = {l.ifindex: l.name for l in self.inventory().links}
            return tc.apply_ops(self.ipr, diff_marks(p.marks, observed, clsact, names), batch=False)
        ifindex = d.ops[0].ifindex
        try:
            observed = self.reader.device_state(d.device, ifindex)
        except KernelError as e:
            return tc.ApplyResult(failed=[(op, e) for op in d.ops])
        fresh = diff_device(dp, observed, self.take_over or cfg.node.take_over) if dp else diff_teardown(observed)
        return tc.apply_ops(self.ipr, fresh.ops, batch=False)

    def teardown(self) -> Report:
        """Remove shaperd's tree from every device that carries it, nothing else."""
        start = time.perf_counter()
        outcomes = []
        for ifindex, name in self._owned_devices(self.inventory()):
            res = tc.apply_ops(self.ipr, [Op("delete-root", name, ifindex, None, "teardown")], batch=False)
            outcomes.append(DeviceOutcome(name, ops=res.applied, failed=res.failed))
            for op in res.applied:
                self.log.info("kernel change", device=op.device, change=op.describe())
        observed, clsact = self.reader.marks()
        names = {l.ifindex: l.name for l in self.inventory().links}
        ops = diff_marks((), observed, clsact, names)
        if ops:
            res = tc.apply_ops(self.ipr, ops, batch=False)
            outcomes.append(DeviceOutcome(MARKS, ops=res.applied, failed=res.failed))
        return Report(plan=Plan(), devices=outcomes, duration_s=time.perf_counter() - start)
