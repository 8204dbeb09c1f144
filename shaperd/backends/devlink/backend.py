"""The devlink backend: per-tenant rate groups on switchdev NICs (kernel side: shaperd/kernel/devlink.py).

Owns the devlink rate nodes named ``shpd_*`` and the parent of the leaves it
put under them; nothing else (objects.py, diff.py). probe resolves the
devlink family once: a kernel without it (this is common: no devlink
device) disables the backend, and no further netlink is spent; the note
becomes a plan warning only where a tenant holds a VF (``wanted``).
observe is one RATE_GET dump (plus a PORT_GET dump where there are
leaves to match to VFs). apply writes one operation at a time and reads the
nodes back, so a value the driver did not keep is a failure, not a silent
success. stats and the metrics collector (report/devlink_metrics.py) read
``snapshot``: per tenant node, the configured share/max and what the kernel
said at the last read.
"""

from __future__ import annotations

import errno as errno_mod
from dataclasses import dataclass, field

from shaperd.core.errors import KernelError
from shaperd.core.inventory import Capabilities, Inventory
from shaperd.kernel import devlink as nl
from shaperd.core.protocol import ApplyResult, BackendStats, PlanInput, Support, TargetDiff
from shaperd.backends.devlink.diff import diff as diff_rates
from shaperd.backends.devlink.objects import DevlinkObserved, DevlinkPlan, Port, Rate
from shaperd.backends.devlink.ops import CreateRateNode, DeleteRateNode, SetLeafParent, SetRateNode
from shaperd.backends.devlink.plan import plan as plan_nodes
from shaperd.backends.devlink.render import render as render_nodes
from shaperd.rdma import plan as rdma_plan


@dataclass(frozen=True)
class NodeRates:
    tenant: str
    instance: str
    node: str
    tx_share_Bps: int
    tx_max_Bps: int


@dataclass(frozen=True)
class DevlinkSnapshot:
    """What the metrics collector reads: configured rates per tenant node, and the kernel's at the last read."""

    configured: tuple[NodeRates, ...] = ()
    kernel: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)  # (instance, node) -> (share, max)
    read_ok: bool = False


def _rate(r: nl.RateRow) -> Rate:
    return Rate(r.instance, node=r.node, port_index=r.port_index, tx_share_Bps=r.tx_share_Bps,
                tx_max_Bps=r.tx_max_Bps, parent=r.parent)


def _port(p: nl.PortRow) -> Port:
    return Port(p.instance, p.index, flavour=p.flavour, vf=p.vf, controller=p.controller, pf=p.pf, netdev=p.netdev)


class DevlinkBackend:
    name = "devlink"
    # What may be left where a teardown could not read (engine/teardown.py words the failure).
    teardown_remains = "its rate nodes (shpd_*) and the leaves parented to them"

    def __init__(self, open_nl=None):
        self._open = open_nl or (lambda: nl.DevlinkNl())
        self._nl = None
        self.snapshot = DevlinkSnapshot()
        self.family_absent = False  # probe: this kernel has no devlink family (nothing to group here)

    def _conn(self):
        if self._nl is None:
            self._nl = self._open()
        return self._nl

    def probe(self, caps: Capabilities) -> Support:
        try:
            self._conn().family()
        except KernelError as e:
            self.close()  # disabled: nothing more is sent, and no socket is kept
            self.family_absent = isinstance(e, nl.DevlinkAbsent)
            why = e.cause if isinstance(e, nl.DevlinkAbsent) else str(e)
            return Support(False, (f"devlink rate groups: {why}",))
        return Support(True)

    def wanted(self, ctx: PlanInput) -> bool:
        """Whether a tenant holds an SR-IOV VF on this node (by rdma.devices or through its pods): only
        then does the tenants file ask for rate groups, and only then is a disabled backend worth a word."""
        inv = ctx.inventory
        return any((dev := inv.rdma_device(port.device)) is not None and dev.is_vf
                   for t in rdma_plan.plan(ctx.config, inv, ctx.tenancy).tenants for port in t.ports)

    def close(self) -> None:
        if self._nl is not None:
            self._nl.close()
            self._nl = None

    def plan(self, ctx: PlanInput) -> DevlinkPlan:
        return plan_nodes(ctx.config, ctx.inventory, ctx.tenancy)

    def observe(self, reads, inv: Inventory) -> DevlinkObserved:
        if self.family_absent:
            return DevlinkObserved()  # no devlink family (probe): no rate object can exist (a teardown's case)
        try:
            rates = tuple(_rate(r) for r in self._conn().rates())
            ports = tuple(_port(p) for p in self._conn().ports()) if any(r.port_index is not None for r in rates) \
                else ()
        except KernelError as e:
            self.snapshot = DevlinkSnapshot(self.snapshot.configured)
            return DevlinkObserved(error=str(e))
        self._record(rates)
        return DevlinkObserved(rates, ports)

    def _record(self, rates) -> None:
        kernel = {(r.instance, r.node): (r.tx_share_Bps, r.tx_max_Bps) for r in rates if r.node is not None}
        self.snapshot = DevlinkSnapshot(self.snapshot.configured, kernel, True)

    def diff(self, desired: DevlinkPlan, observed: DevlinkObserved) -> list[TargetDiff]:
        return diff_rates(desired, observed)

    def apply(self, diff: TargetDiff, batch: bool = True) -> ApplyResult:
        res = ApplyResult()  # one write at a time: nothing can land half-way
        conn = self._conn()
        for op in diff.ops:
            try:
                if isinstance(op, CreateRateNode):
                    conn.new_node(op.device, op.node, op.tx_share_Bps, op.tx_max_Bps)
                elif isinstance(op, SetRateNode):
                    conn.set_node(op.device, op.node, op.tx_share_Bps, op.tx_max_Bps)
                elif isinstance(op, SetLeafParent):
                    conn.set_leaf_parent(op.device, op.port_index, op.parent)
                elif isinstance(op, DeleteRateNode):
                    conn.del_node(op.device, op.node)
                else:  # pragma: no cover - diff makes no other kind
                    raise KernelError(op.verb, op.what(), op.device, f"unknown operation {type(op).__name__}")
            except KernelError as e:
                if op.deletes and e.errno == errno_mod.ENOENT:
                    res.applied.append(op)  # already gone
                else:
                    res.failed.append((op, op.error(e.cause, e.errno)))
            else:
                res.applied.append(op)
        self._verify(res)
        return res

    def _verify(self, res: ApplyResult) -> None:
        """Read the nodes back: a share or max the driver did not keep turns its write into a failure."""
        writes = [op for op in res.applied if isinstance(op, (CreateRateNode, SetRateNode))]
        if not writes:
            return
        try:
            rates = self._conn().rates()
        except KernelError as e:
            for op in writes:
                res.applied.remove(op)
                res.failed.append((op, op.error(f"written, but could not be read back: {e}", e.errno)))
            return
        self._record(tuple(_rate(r) for r in rates))
        got = {(r.instance, r.node): r for r in rates if r.node is not None}
        for op in writes:
            r = got.get((op.device, op.node))
            want = {"tx_share": op.tx_share_Bps, "tx_max": op.tx_max_Bps}
            have = {"tx_share": r.tx_share_Bps, "tx_max": r.tx_max_Bps} if r is not None else None
            bad = "node is missing" if have is None else ", ".join(
                f"{k} reads {have[k]} B/s" for k, v in want.items() if v is not None and have[k] != v)
            if bad:
                res.applied.remove(op)
                res.failed.append((op, op.error(f"did not stick: {bad}")))

    def teardown(self, observed: DevlinkObserved) -> list[TargetDiff]:
        return diff_rates(DevlinkPlan(), observed)

    def stats(self, desired: DevlinkPlan) -> BackendStats:
        conf = tuple(NodeRates(n.tenant, n.instance, n.node, n.tx_share_Bps, n.tx_max_Bps) for n in desired.nodes)
        self.snapshot = DevlinkSnapshot(conf, self.snapshot.kernel, self.snapshot.read_ok)
        return BackendStats(devices=desired.instances)

    def render(self, desired: DevlinkPlan) -> str:
        vf_ports = {}
        if desired.nodes:
            try:
                vf_ports = {(p.instance, p.vf): p.index for p in self._conn().ports()
                            if p.flavour == nl.PORT_FLAVOUR_PCI_VF and p.vf is not None and not p.controller}
            except KernelError:
                pass  # placeholders then: `shaperd plan` still shows the groups
        return render_nodes(desired, vf_ports)
