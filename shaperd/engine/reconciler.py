"""One reconcile over every backend: discover -> tenancy -> (plan -> observe -> diff -> apply) per backend.

Generic: it knows the backend protocol (core/protocol.py), not what any
backend writes. Each backend, and each target within it, is handled on its
own: a foreign qdisc, a missing capacity, a netlink error or a bug in one is
reported and never stops enforcement by the others. When a backend's batch
of writes fails part-way, the engine reads that backend's state again,
diffs again and replays the remaining writes one at a time, so each failure
names its object while the others still land.
"""

from __future__ import annotations

import contextlib
import errno
import time
from dataclasses import dataclass, field
from typing import Any

from shaperd.core import log
from shaperd.core.protocol import ApplyResult, Backend, BackendStats, ClassTarget, NodeContext, Operation, PlanInput, Support, TargetDiff
from shaperd.core.config import Config
from shaperd.discovery import cgroups as cgroups_mod
from shaperd.discovery import pods as pods_mod
from shaperd.discovery import rdma as rdma_mod
from shaperd.discovery.node import discover
from shaperd.core.errors import ConfigProblem, KernelError, ShaperdError
from shaperd.core.inventory import Capabilities, Inventory
from shaperd.kernel.rtnl import CachedReads
from shaperd.core.roots import DEFAULT, Roots
from shaperd.core.tenancy import Tenancy, select_devices, tenancy
from shaperd.core.podcaps import shown
from shaperd.engine import fallback
from shaperd.engine import teardown as teardown_mod
from shaperd.engine.annotations import AnnotationLedger


@dataclass
class TargetOutcome:
    """What happened on one target (a device, or a backend's pseudo-device)."""

    backend: str
    device: str
    ops: list[Operation] = field(default_factory=list)  # planned (diff) or applied (apply)
    failed: list[tuple[Operation, KernelError]] = field(default_factory=list)
    blocked: str | None = None
    error: str | None = None  # the target (or the whole backend) could not be read or planned
    note: str | None = None  # left in place on purpose, said once (a teardown's shared clsact): not a failure


@dataclass
class BackendOutcome:
    name: str
    desired: Any = None
    stats: BackendStats = field(default_factory=BackendStats)
    targets: list[TargetOutcome] = field(default_factory=list)
    error: str | None = None  # the backend failed as a whole; the others went on


@dataclass(frozen=True)
class PlanResult:
    """The desired state of every enabled backend, from one tenancy."""

    tenancy: Tenancy = field(default_factory=Tenancy)
    desired: dict[str, Any] = field(default_factory=dict)
    # What the tenants file asks for that this node cannot give: a disabled backend it needs, a cgroup
    # that is not there (Reconciler.unmet). Warnings, like the backends' own.
    unmet: tuple[str, ...] = ()

    @property
    def problems(self) -> tuple[ConfigProblem, ...]:
        return tuple(p for d in self.desired.values() for p in d.problems)

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.tenancy.warnings + self.unmet + tuple(w for d in self.desired.values() for w in d.warnings)

    @property
    def pod_tenants(self) -> dict[str, str]:
        return self.tenancy.pod_tenants


@dataclass
class Report:
    plan: PlanResult
    backends: list[BackendOutcome] = field(default_factory=list)
    duration_s: float = 0.0
    inventory: Inventory | None = None  # what the reconcile found (the RDMA sampler's ports come from it)

    @property
    def devices(self) -> list[TargetOutcome]:
        """Every target outcome; a backend that failed as a whole appears as one target with its error."""
        out = []
        for b in self.backends:
            if b.error:
                out.append(TargetOutcome(b.name, "node", error=b.error))
            out.extend(b.targets)
        return out

    @property
    def changes(self) -> int:
        return sum(len(d.ops) for d in self.devices)

    @property
    def problems(self) -> tuple[ConfigProblem, ...]:
        return self.plan.problems

    @property
    def planned_devices(self) -> tuple[str, ...]:
        return tuple(sorted({d for b in self.backends for d in b.stats.devices}))

    @property
    def targets(self) -> dict[tuple[str, int], ClassTarget]:
        """(device, classid) -> what it enforces, over every backend (the metrics sampler's targets)."""
        return {k: v for b in self.backends for k, v in b.stats.targets.items()}

    @property
    def endpoints(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for b in self.backends:
            for tenant, kinds in b.stats.endpoints.items():
                mine = out.setdefault(tenant, {})
                for kind, n in kinds.items():
                    mine[kind] = mine.get(kind, 0) + n
        return out

    @property
    def ok(self) -> bool:
        return not self.problems and not any(d.failed or d.error or d.blocked for d in self.devices)


class Reconciler:
    def __init__(self, reader, backends: list[Backend], capabilities: Capabilities, *, roots: Roots = DEFAULT,
                 pods_source=None, cgroup_root=None, pod_resources=None, device_probe=None):
        # Reads go through one rtnetlink reader (kernel/rtnl.py) in the same namespace as the
        # backends' writers: both are opened by open_node() through kernel/netns.py.
        self.reader = reader
        self.backends = list(backends)
        self.capabilities = capabilities
        self.roots = roots
        # Callable returning the pods on this node (PodInfo-like objects), or None without Kubernetes.
        self.pods_source = pods_source
        # discovery.podresources.source.PodResourcesSource (the kubelet's device assignments), or None.
        self.pod_resources = pod_resources
        # discovery.htb_offload.DeviceProbe (the uplinks' HTB offload capability), or None (not probed).
        self.device_probe = device_probe
        self.cgroup_root = cgroup_root if cgroup_root is not None else cgroups_mod.cgroup2_root(roots)
        self.log = log.get("shaperd.reconcile")
        # <run>/shaperd/refused-<scope>.json, set by open_node: what applies found the kernel refuses, for status.
        self.refused_file = None
        self._refusals_recorded: dict | None = None
        # Refused pod bandwidth annotations: each logged once (not every resync) and counted (engine/annotations.py).
        self.annotations = AnnotationLedger()
        # Probed once: a backend this kernel cannot run is left out. Its reason becomes a plan warning
        # where the tenants file needs it (unmet): a backend nothing asks for is silent.
        self.support: dict[str, Support] = {b.name: b.probe(capabilities) for b in self.backends}

    @property
    def enabled(self) -> list[Backend]:
        return [b for b in self.backends if self.support[b.name].enabled]

    def capability_report(self) -> dict:
        """What this process found it can do: each backend on or off, and the probed kernel features. The
        daemon logs it at start; tests/systemd compares the unit's with a run outside the unit's sandbox."""
        c = self.capabilities
        return {"backends": {b.name: self.support[b.name].enabled for b in self.backends},
                "kernel": {"htb": c.htb, "u32": c.u32, "bpf": c.bpf, "bpf_maps": c.bpf_maps, "bpf_adopt": c.bpf_adopt,
                           "fq": c.fq, "mq": c.mq, "leaf_kinds": sorted(c.leaf_kinds)}}

    # -- inputs ----------------------------------------------------------------
    def inventory(self, cfg: Config | None = None) -> Inventory:
        inv = discover(self.reader, self.capabilities, self.roots)
        pods = ()
        if self.pods_source is not None:
            pods = pods_mod.resolve(self.reader, list(self.pods_source()), inv.links, self.cgroup_root)
        refs = []
        if cfg is not None and self.cgroup_root is not None:
            for t in cfg.tenants:
                for path in t.match.cgroups:
                    r = cgroups_mod.ref(self.cgroup_root, path, self.roots)
                    if r is not None:
                        refs.append(r)  # one that is not there is said by unmet()
        rdma, rdma_notes = rdma_mod.discover(self.roots)
        if self.pod_resources is not None and pods:
            pods, notes = self.pod_resources.resolve(pods)
            rdma_notes += notes
        inv = Inventory(links=inv.links, default_route_devices=inv.default_route_devices,
                        capabilities=inv.capabilities, pods=pods, cgroups=tuple(refs), rdma=rdma,
                        rdma_notes=rdma_notes)
        if self.device_probe is not None and cfg is not None and cfg.node.htb_offload != "off":
            inv = self.device_probe.annotate(inv, select_devices(cfg, inv)[0])
        return inv

    def plan(self, cfg: Config, inv: Inventory | None = None) -> PlanResult:
        """Pure given the inventory: every enabled backend's desired state."""
        inv = inv or self.inventory(cfg)
        ctx = self._plan_input(cfg, inv)
        return PlanResult(ctx.tenancy, {b.name: b.plan(ctx) for b in self.enabled}, self.unmet(ctx))

    def unmet(self, ctx: PlanInput) -> tuple[str, ...]:
        """What the tenants file asks for that this node cannot give: each disabled backend it needs here
        (the backend's optional ``wanted(ctx)``; without one, always) with its probe notes, and each
        ``match.cgroups`` entry that is not there."""
        out = []
        for b in self.backends:
            s = self.support[b.name]
            if s.enabled:
                continue
            wanted = getattr(b, "wanted", None)
            try:
                needed = wanted is None or wanted(ctx)
            except Exception:  # noqa: BLE001 - a buggy check must not hide that a backend is off
                needed = True
            if needed:
                out += [f"{b.name} backend disabled: {n}" for n in s.notes or ("not supported here",)]
        if self.cgroup_root is not None:
            found = {r.path for r in ctx.inventory.cgroups}
            out += [f"tenant {t.name}: cgroup {path} not found under {self.cgroup_root}: not matched until it "
                    "exists" for t in ctx.config.tenants for path in t.match.cgroups if path not in found]
        return tuple(out)

    # -- the reconcile ---------------------------------------------------------
    def diff(self, cfg: Config) -> Report:
        return self._reconcile(cfg, write=False)

    def _plan_input(self, cfg: Config, inv: Inventory) -> PlanInput:
        refused = fallback.collect(self.enabled, inv)  # what earlier applies found this kernel refuses, as data
        return PlanInput(cfg, inv, tenancy(cfg, inv, refused), refused)

    def apply(self, cfg: Config) -> Report:
        before = fallback.collect(self.enabled, None)
        rep = self._reconcile(cfg, write=True)
        if fallback.added(before, fallback.collect(self.enabled, None)):  # a new refusal: plan and apply its fallback now
            rep = fallback.merged(rep, self._reconcile(cfg, write=True))
        self._record_refusals()
        for pr in rep.problems:
            self.log.error("device not shaped", problem=str(pr))
        for w in rep.plan.warnings:
            self.log.warning("plan warning", warning=w)
        for a in self.annotations.observe(rep.plan.tenancy.invalid_annotations):
            self.log.warning("pod annotation refused", pod=a.ref, uid=a.uid, annotation=a.key, value=shown(a.value),
                             reason=a.reason, warning=a.warning())
        for t in rep.devices:
            if t.blocked:
                self.log.warning("device left alone", backend=t.backend, device=t.device, reason=t.blocked)
            if t.error:
                self.log.error("device not readable", backend=t.backend, device=t.device, error=t.error)
        return rep

    def _record_refusals(self) -> None:
        """Keep ``refused_file`` (report/edt_refused.py) equal to the refusals, for ``shaperd status``."""
        now = fallback.collect(self.enabled, None)
        if self.refused_file is not None and now != self._refusals_recorded:
            from shaperd.engine import refusals_file as edt_refused

            try:
                edt_refused.record(self.refused_file, now)
                self._refusals_recorded = now
            except OSError as e:
                self.log.warning("refusals not recorded for shaperd status", file=str(self.refused_file), error=str(e))

    def _reconcile(self, cfg: Config, write: bool) -> Report:
        start = time.perf_counter()
        inv = self.inventory(cfg)
        ctx = self._plan_input(cfg, inv)
        reads = CachedReads(self.reader)  # one node-wide qdisc dump serves every backend
        desired: dict[str, Any] = {}
        outcomes = []
        for b in self.enabled:
            bo = BackendOutcome(b.name)
            outcomes.append(bo)
            try:
                bo.desired = desired[b.name] = b.plan(ctx)
                bo.stats = b.stats(bo.desired)
                for td in b.diff(bo.desired, b.observe(reads, inv)):
                    bo.targets.append(self._settle(b, bo.desired, td, inv, write))
                if write and any(t.ops for t in bo.targets):
                    # This backend wrote (a clsact qdisc, a root): the backends after it read the node afresh,
                    # not the dump taken before. An in-sync reconcile still reads it once.
                    reads = CachedReads(self.reader)
            except Exception as e:  # noqa: BLE001 - one backend never stops the others
                bo.error = self._backend_failed(b, e)
        return Report(PlanResult(ctx.tenancy, desired, self.unmet(ctx)), outcomes, time.perf_counter() - start,
                      inventory=inv)

    def _settle(self, b: Backend, desired, td: TargetDiff, inv: Inventory, write: bool) -> TargetOutcome:
        out = TargetOutcome(b.name, td.target, blocked=td.blocked, error=td.error)
        if not write or not td.ops:
            out.ops = list(td.ops)
            return out
        res = b.apply(td, batch=True)
        if res.batch_failed:
            # Some writes may have landed: read again, diff again, then one by one.
            res = self._one_by_one(b, desired, td, inv)
        out.ops, out.failed = res.applied, res.failed
        gone = self._vanished(res.failed)
        if gone:
            # A pod's veth deleted between discovery and this write: nothing is left to enforce there, and
            # its link event brings the next reconcile. Not a failure (it would count against health).
            out.failed = [(op, e) for op, e in res.failed if (op, e) not in gone]
            names = sorted({op.device for op, _ in gone})
            out.note = f"{len(gone)} write(s) not made: {', '.join(names)} went away during the reconcile"
            self.log.info("device went away during the reconcile", backend=b.name, devices=names,
                          writes=len(gone))
            res = ApplyResult(applied=res.applied, failed=out.failed, batch_failed=res.batch_failed)
        self._log_writes(b, res)
        return out

    def _vanished(self, failed) -> list:
        """The failed writes that failed with ENODEV on a device that no longer exists (read once, only then)."""
        nodev = [(op, e) for op, e in failed if getattr(e, "errno", None) == errno.ENODEV and op.ifindex > 0]
        if not nodev:
            return []
        try:
            present = {l.ifindex for l in self.reader.links()}
        except KernelError:
            return []  # cannot tell: a failure it stays
        return [(op, e) for op, e in nodev if op.ifindex not in present]

    def _one_by_one(self, b: Backend, desired, td: TargetDiff, inv: Inventory) -> ApplyResult:
        try:
            fresh = [d for d in b.diff(desired, b.observe(CachedReads(self.reader), inv)) if d.target == td.target]
        except KernelError as e:
            return ApplyResult(failed=[(op, e) for op in td.ops])
        if not fresh or not fresh[0].ops:
            return ApplyResult()
        return b.apply(fresh[0], batch=False)

    def teardown(self, dry_run: bool = False) -> Report:
        """Remove what every backend owns, nothing else; ``dry_run``: report the removals, apply none.

        Each backend says what "nothing desired" is for it; engine/teardown.py keeps what matters, and
        a target that could not be read fails the teardown (not ``ok``), naming what may remain there.
        Last, the clsact qdiscs that held only shaperd's filters, read before any backend removed its
        own, are removed."""
        start = time.perf_counter()
        inv = self.inventory()
        reads = CachedReads(self.reader)
        shared = BackendOutcome(teardown_mod.CLSACT)
        try:
            found = teardown_mod.clsacts(reads, inv, self.backends)
        except Exception as e:  # noqa: BLE001 - the backends still remove their own
            found = []
            shared.error = teardown_mod.backend_unreadable(teardown_mod.CLSACT, teardown_mod.CLSACT_REMAINS, str(e))
            self.log.error("teardown incomplete", backend=teardown_mod.CLSACT, error=shared.error)
        outcomes = []
        for b in self.backends:
            bo = BackendOutcome(b.name)
            outcomes.append(bo)
            try:
                for td in teardown_mod.kept(b.teardown(b.observe(reads, inv))):
                    bo.targets.append(self._tear(b, b.name, teardown_mod.remains(b), td, dry_run))
            except Exception as e:  # noqa: BLE001
                bo.error = teardown_mod.backend_unreadable(b.name, teardown_mod.remains(b), self._backend_failed(b, e))
        for owner, td in teardown_mod.clsact_diffs(found, self.backends):
            shared.targets.append(self._tear(owner, teardown_mod.CLSACT, teardown_mod.CLSACT_REMAINS, td, dry_run))
        if shared.targets or shared.error:
            outcomes.append(shared)
        if not dry_run and self.refused_file is not None:
            with contextlib.suppress(OSError):
                self.refused_file.unlink(missing_ok=True)  # nothing of edt's is left to explain
        return Report(PlanResult(), outcomes, time.perf_counter() - start)

    def _tear(self, b: Backend | None, name: str, remains: str, td: TargetDiff, dry_run: bool) -> TargetOutcome:
        """One kept teardown target: its removals applied (``dry_run``: only listed), its failure worded."""
        error = teardown_mod.unreadable(name, remains, td.target, td.error) if td.error else None
        out = TargetOutcome(name, td.target, ops=list(td.ops), blocked=td.blocked, error=error, note=td.note)
        if error:
            self.log.error("teardown incomplete", backend=name, device=td.target, error=error)
        if td.blocked:
            self.log.warning("device left alone", backend=name, device=td.target, reason=td.blocked)
        if td.note:
            self.log.info("left in place", backend=name, device=td.target, reason=td.note)
        if dry_run or not td.ops or b is None:  # the same diff, never handed to apply: nothing is sent
            return out
        res = b.apply(td, batch=False)
        out.ops, out.failed = res.applied, res.failed
        self._log_writes(b, res, name)
        return out

    def _backend_failed(self, b: Backend, e: Exception) -> str:
        if isinstance(e, ShaperdError):
            self.log.error("backend failed; the others went on", backend=b.name, error=str(e))
            return str(e)
        self.log.exception("backend failed with an internal error; the others went on", backend=b.name)
        return f"{b.name} backend: internal error: {e!r}"

    def _log_writes(self, b: Backend, res: ApplyResult, name: str | None = None) -> None:
        name = name or b.name  # a teardown's clsact is applied through a backend, logged as "clsact"
        for op in res.applied:
            self.log.info("kernel change", backend=name, device=op.device, tenant=op.tenant, change=op.describe())
        for op, err in res.failed:
            self.log.error("kernel write failed", backend=name, device=op.device, tenant=op.tenant, error=str(err))


def default_backends(writer, take_over: bool = False, roots: Roots = DEFAULT, netns: str | None = None,
                     pins=None, capabilities: Capabilities | None = None) -> list[Backend]:
    """Every registered backend (engine/registry.py), in the order they are reconciled; ``pins``: the map
    classifier's PinStore (edt derives its stampers' from ``capabilities``)."""
    from shaperd.engine.registry import REGISTRY

    return REGISTRY.build(NodeContext(writer=writer, roots=roots, netns=netns, take_over=take_over,
                                      classifier_pins=pins, capabilities=capabilities))


def open_node(caps: Capabilities, *, netns: str | None = None, roots: Roots = DEFAULT, take_over: bool = False,
              pods_source=None, pod_resources=None) -> Reconciler:
    """A reconciler whose reader and writers all live in one namespace (kernel/netns.py)."""
    from shaperd.backends.htb.offload_probe import DeviceProbe
    from shaperd.engine import refusals_file
    from shaperd.engine.registry import REGISTRY
    from shaperd.kernel import bpf_pins, tc
    from shaperd.kernel.rtnl import RtnlReader

    reader = RtnlReader(netns, run_root=str(roots.run))
    writer = tc.open_writer(netns, str(roots.run), codec=REGISTRY.codec())
    # The map classifier's maps come back through bpffs pins where the probe found them usable.
    pins = bpf_pins.PinStore(caps.bpf_pin_root, bpf_pins.scope_for(netns)) if caps.bpf_adopt == "pins" else None
    rec = Reconciler(reader, default_backends(writer, take_over, roots, netns, pins, capabilities=caps), caps,
                     roots=roots, pods_source=pods_source, pod_resources=pod_resources,
                     device_probe=DeviceProbe(netns, roots))
    rec.refused_file = refusals_file.path_for(roots.run, netns)
    return rec


def diff_one(reader, backend, cfg: Config, roots: Roots = DEFAULT) -> Report:
    """Plan ``backend`` alone as the running agent does and diff it without writing (status sections and
    the backends' read-only commands get this, so they never import the engine)."""
    return Reconciler(reader, [backend], Capabilities(), roots=roots).diff(cfg)
