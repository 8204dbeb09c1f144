"""The DCB backend: the protocol's steps for ETS, max rates and DSCP APP entries on the RoCE uplinks.

Owns, on each RoCE PF netdev a tenant's RDMA device uses: the ETS table
(tc_tsa, tc_tx_bw, prio_tc), the per-TC max rates, and the DSCP APP entries
for the DSCPs of its plan. Never touches: other APP entries (reported), PFC
(read and reported only: the fabric team's decision), DCBX mode. The DCB
netlink lives in kernel/dcb.py; the socket is opened on first use, so a node
without RoCE ports opens none and sends nothing.

A driver without an op is skipped by the kernel, which still answers
success: after writing, apply reads back, and a write that did not stick is
a failure once (one log line per netdev), remembered per netdev with the
plan it was for, and not re-sent until that plan changes (diff blocks it;
``status()`` shows it).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field

from shaperd.core import log
from shaperd.core.errors import KernelError
from shaperd.core.inventory import Capabilities, Inventory
from shaperd.core.protocol import ApplyResult, BackendStats, PlanInput, Support, TargetDiff
from shaperd.rdma import plan as rdma_plan
from shaperd.backends.dcb import diff as dcb_diff
from shaperd.backends.dcb import plan as dcb_plan
from shaperd.backends.dcb import render as dcb_render
from shaperd.backends.dcb.ops import AddDscpApps, DeleteDscpApps, SetEts, SetMaxrate
from shaperd.backends.dcb.plan import MAX_TCS, SEL_DSCP, DcbPlan


@dataclass
class DcbObserved:
    states: dict = field(default_factory=dict)  # netdev -> kernel.dcb.DcbState
    errors: dict[str, str] = field(default_factory=dict)  # netdev -> why it could not be read
    stuck: dict[str, tuple] = field(default_factory=dict)  # netdev -> (plan key, kinds that did not stick)
    no_dcb: set[str] = field(default_factory=set)  # netdevs whose driver has no DCB (their error says so)


@dataclass(frozen=True)
class NetdevStatus:
    """What status and metrics show for one netdev: configured, read back, and what is not enforced."""

    netdev: str
    configured: dcb_plan.NetdevDcb | None
    read: object | None = None  # kernel.dcb.DcbState
    error: str | None = None
    not_sticking: tuple[str, ...] = ()
    foreign_apps: tuple[tuple[int, int], ...] = ()
    pfc_priorities: tuple[int, ...] | None = None
    pfc_notes: tuple[str, ...] = ()


def roce_uplinks(inv: Inventory) -> list[str]:
    return sorted({nd for d in inv.rdma if not d.is_vf for p in d.ports if p.link_layer == "Ethernet"
                   for nd in p.netdevs})


class DcbBackend:
    name = "dcb"
    # What may be left on a netdev a teardown could not read (engine/teardown.py words the failure).
    teardown_remains = "the per-TC max rates shaperd set"

    def __init__(self, netns: str | None = None, run_root: str = "/run", client=None):
        self.netns, self.run_root = netns, run_root
        self._client = client
        self._plan = DcbPlan()
        self._stuck: dict[str, tuple] = {}
        self._status: dict[str, NetdevStatus] = {}
        self.log = log.get("shaperd.dcb")

    @property
    def client(self):
        if self._client is None:
            from shaperd.kernel.dcb import DcbClient
            from shaperd.kernel.rtnl import RtnlReader

            self._client = DcbClient(RtnlReader(self.netns, run_root=self.run_root))
        return self._client

    def probe(self, caps: Capabilities) -> Support:
        return Support(True)

    def plan(self, ctx: PlanInput) -> DcbPlan:
        rdma = rdma_plan.plan(ctx.config, ctx.inventory, ctx.tenancy)
        self._plan = dcb_plan.plan(ctx.config, ctx.inventory, rdma.tenants)
        return self._plan

    def observe(self, reads, inv: Inventory) -> DcbObserved:
        from shaperd.kernel.dcb import DcbNotSupported

        obs = DcbObserved(stuck=dict(self._stuck))
        for nd in sorted(set(roce_uplinks(inv)) | {n.netdev for n in self._plan.netdevs}):
            try:
                obs.states[nd] = self.client.get(nd)
            except DcbNotSupported as e:
                obs.errors[nd] = f"{e} (the driver of {nd} has no DCB)"
                obs.no_dcb.add(nd)
            except KernelError as e:
                obs.errors[nd] = str(e)
        self._remember(obs)
        return obs

    def _remember(self, obs: DcbObserved) -> None:
        new = {nd: self._netdev_status(nd, obs.states.get(nd), obs.errors.get(nd))
               for nd in sorted(set(obs.states) | set(obs.errors))}
        for nd, s in new.items():  # one log line when what is left alone changes, not one per reconcile
            old = self._status.get(nd)
            if s.foreign_apps and (old is None or old.foreign_apps != s.foreign_apps):
                self.log.info("DCB APP entries not shaperd's: left alone", netdev=nd,
                              dscp_prio=[f"{d}:{p}" for d, p in s.foreign_apps])
            if s.pfc_notes and (old is None or old.pfc_notes != s.pfc_notes):
                self.log.warning("PFC does not cover a tenant's priority (read only)", netdev=nd,
                                 notes=list(s.pfc_notes))
        self._status = new

    def _netdev_status(self, nd: str, st, error: str | None) -> NetdevStatus:
        want = self._plan.netdev(nd)
        stuck = self._stuck.get(nd)
        kinds = tuple(sorted(stuck[1])) if stuck and want is not None and stuck[0] == want.key else ()
        return NetdevStatus(
            nd, want, st, error, kinds,
            dcb_diff.foreign_apps(want, st) if st is not None else (),
            st.pfc.priorities if st is not None and st.pfc is not None else None,
            dcb_diff.pfc_gaps(want, st) if st is not None and want is not None else ())

    def status(self) -> dict[str, NetdevStatus]:
        """The last read of every RoCE uplink (for status and metrics)."""
        return dict(self._status)

    def diff(self, desired: DcbPlan, observed: DcbObserved) -> list[TargetDiff]:
        return dcb_diff.diff(desired, observed)

    def apply(self, diff: TargetDiff, batch: bool = True) -> ApplyResult:
        res = ApplyResult()  # one DCB message per operation: nothing fails part-way
        nd = diff.target
        for op in diff.ops:
            try:
                self._write(op)
            except KernelError as e:
                if op.deletes and e.errno == errno.ENOENT:
                    # mlx5 drops the old entry of a DSCP itself when the new one is added (added first, so
                    # the port never falls back to PCP trust in between): already gone is done.
                    res.applied.append(op)
                    continue
                res.failed.append((op, op.error(e.cause, e.errno)))
            else:
                res.applied.append(op)
        if not res.applied:
            return res
        try:
            state = self.client.get(nd)
        except KernelError as e:
            res.failed.extend((op, op.error(f"written, but the read-back failed: {e.cause}", e.errno))
                              for op in res.applied)
            res.applied = []
            return res
        sticking = []
        missed: set[str] = set()
        for op in res.applied:
            why = self._not_stuck(op, state)
            if why is None:
                sticking.append(op)
            else:
                missed.add(op.kind)
                res.failed.append((op, op.error(f"the kernel acknowledged, but {why}: the driver lacks the operation;"
                                                " not re-sent until the plan changes")))
        res.applied = sticking
        if missed:
            key = next(op.plan_key for op in diff.ops)
            prev = self._stuck.get(nd)
            kinds = (prev[1] if prev and prev[0] == key else frozenset()) | frozenset(missed)
            self._stuck[nd] = (key, kinds)
            self.log.warning("DCB write did not stick", netdev=nd, kinds=sorted(kinds))
        self._status = {**self._status, nd: self._netdev_status(nd, state, None)}
        return res

    def _write(self, op) -> None:
        from shaperd.kernel.dcb import App, Ets

        c = self.client
        if isinstance(op, SetEts):
            c.set(op.device, ets=Ets(tc_tx_bw=op.tc_bw_pct, tc_tsa=op.tc_tsa, prio_tc=op.prio_tc))
        elif isinstance(op, SetMaxrate):
            c.set(op.device, maxrate_kbps=op.maxrate_kbps)
        elif isinstance(op, AddDscpApps):
            c.set(op.device, apps=[App(SEL_DSCP, d, p) for d, p in op.dscp_prio])
        elif isinstance(op, DeleteDscpApps):
            c.delete_apps(op.device, [App(SEL_DSCP, d, p) for d, p in op.dscp_prio])
        else:  # pragma: no cover - diff makes no other kind
            raise KernelError(op.verb, op.what(), op.device, f"unknown operation {type(op).__name__}")

    @staticmethod
    def _not_stuck(op, state) -> str | None:
        """None when the read-back shows ``op``'s effect, else what it shows."""
        if isinstance(op, SetEts):
            e = state.ets
            if e is None or (e.tc_tx_bw, e.tc_tsa, e.prio_tc) != (op.tc_bw_pct, op.tc_tsa, op.prio_tc):
                return "the read-back ETS differs" if e is not None else "the driver reports no ETS"
        elif isinstance(op, SetMaxrate):
            have = state.maxrate_kbps
            if have is None or not all(dcb_diff.maxrate_in_sync(w, h) for w, h in zip(op.maxrate_kbps, have)):
                return f"the read-back max rates are {have}" if have is not None else "the driver reports no max rates"
        elif isinstance(op, AddDscpApps):
            have = dcb_diff.dscp_entries(state)
            if any(p not in have.get(d, ()) for d, p in op.dscp_prio):
                return "the APP table lacks entries"
        elif isinstance(op, DeleteDscpApps):
            have = dcb_diff.dscp_entries(state)
            if any(p in have.get(d, ()) for d, p in op.dscp_prio):
                return "the APP table still has the entries"
        return None

    def teardown(self, observed: DcbObserved) -> list[TargetDiff]:
        """Lift the max rates (a cap no agent maintains any more); ETS shares, APP entries and PFC stay.

        A netdev whose driver has no DCB holds nothing of shaperd's; any other read error fails the teardown."""
        out = [TargetDiff(nd, error=err) for nd, err in sorted(observed.errors.items()) if nd not in observed.no_dcb]
        for nd, st in sorted(observed.states.items()):
            td = TargetDiff(nd)
            if st.maxrate_kbps is not None and any(st.maxrate_kbps):
                td.ops.append(SetMaxrate(device=nd, ifindex=0, maxrate_kbps=(0,) * MAX_TCS,
                                         reason="teardown: no agent maintains the TC caps"))
            out.append(td)
        return out

    def stats(self, desired: DcbPlan) -> BackendStats:
        return BackendStats(devices=tuple(n.netdev for n in desired.netdevs))

    def render(self, desired: DcbPlan) -> str:
        return dcb_render.render(desired)
