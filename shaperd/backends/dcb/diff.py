"""Diff the desired DCB state of each netdev against what the kernel read back, pure.

``observed`` is a ``DcbObserved`` (backends/dcb/backend.py): per netdev a
``kernel.dcb.DcbState`` or the error reading it, plus what did not stick
before. Per netdev:

- ETS (tc_tsa, tc_tx_bw, prio_tc) and max rates are set when they differ;
  a max rate the driver rounded down within its granularity (mlx5 keeps
  100 Mbit/s or 1 Gbit/s steps) counts as in sync (``maxrate_in_sync``);
- APP: a DSCP shaperd maps gets its entry; another priority for that DSCP
  is deleted (shaperd owns the DSCPs of its plan). DSCP entries for DSCPs
  shaperd does not plan are foreign: left alone, and said so. Other
  selectors are not looked at.
- a kind of write that did not stick for the same plan is not sent again
  (no retry storm): the target is blocked with the reason, until the plan changes.
- a driver that reports no ETS (no get op) is not written ETS (it could not be verified).

An in-sync netdev gives no operation.
"""

from __future__ import annotations

from shaperd.core.protocol import TargetDiff
from shaperd.backends.dcb.ops import AddDscpApps, DeleteDscpApps, SetEts, SetMaxrate
from shaperd.backends.dcb.plan import SEL_DSCP, DcbPlan, NetdevDcb

# A driver rounds a max rate down to its step; at most this far below is "in sync" (mlx5: 1 Gbit/s steps above 25.5G).
MAXRATE_ROUNDING_KBPS = 1_000_000


def maxrate_in_sync(want: int, have: int) -> bool:
    if want == have:
        return True
    return want > 0 and 0 < have <= want and want - have < MAXRATE_ROUNDING_KBPS


def dscp_entries(state) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for a in state.apps:
        if a.selector == SEL_DSCP:
            out.setdefault(a.protocol, set()).add(a.priority)
    return out


def diff_netdev(want: NetdevDcb, state, stuck: tuple | None) -> TargetDiff:
    """The writes for one netdev; ``blocked`` says what is deliberately not written, and why."""
    nd = want.netdev
    out = TargetDiff(nd)
    gaps: list[str] = []
    skip: frozenset[str] = frozenset()
    if stuck is not None and stuck[0] == want.key:
        skip = stuck[1]
        gaps.append(f"{', '.join(sorted(skip))} did not stick on {nd} (the kernel acked, the read-back differs: "
                    "the driver lacks the operation); not re-sent until the plan changes")
    key = want.key
    ets = state.ets
    if ets is None:
        gaps.append(f"the driver of {nd} reports no ETS: ETS and max rates are not written (they could not be "
                    "verified)")
    elif ets.ets_cap and ets.ets_cap < tcs_needed(want):
        gaps.append(f"{nd} supports {ets.ets_cap} ETS traffic classes, the plan needs {tcs_needed(want)}: ETS and "
                    "max rates not written")
    else:
        if "ets" not in skip and (ets.tc_tx_bw, ets.tc_tsa, ets.prio_tc) != (want.tc_bw_pct, want.tc_tsa, want.prio_tc):
            out.ops.append(SetEts(device=nd, ifindex=0, tc_bw_pct=want.tc_bw_pct, tc_tsa=want.tc_tsa,
                                  prio_tc=want.prio_tc, plan_key=key, reason="ETS differs"))
        have = state.maxrate_kbps
        if have is None:
            if any(want.maxrate_kbps):
                gaps.append(f"the driver of {nd} reports no max rates: TC limits are not enforced there")
        elif "maxrate" not in skip and not all(maxrate_in_sync(w, h) for w, h in zip(want.maxrate_kbps, have)):
            out.ops.append(SetMaxrate(device=nd, ifindex=0, maxrate_kbps=want.maxrate_kbps, plan_key=key,
                                      reason="max rates differ"))
    have_apps = dscp_entries(state)
    wanted = dict(want.dscp_prio)
    add = tuple((d, p) for d, p in want.dscp_prio if p not in have_apps.get(d, ()))
    stale = tuple(sorted((d, p) for d, ps in have_apps.items() if d in wanted for p in ps if p != wanted[d]))
    if add and "app" not in skip:
        out.ops.append(AddDscpApps(device=nd, ifindex=0, dscp_prio=add, plan_key=key, reason="missing"))
    if stale and "app-del" not in skip:
        out.ops.append(DeleteDscpApps(device=nd, ifindex=0, dscp_prio=stale, plan_key=key,
                                      reason="replaced: shaperd maps these DSCPs to other priorities"))
    if gaps:
        out.blocked = "; ".join(gaps)
    return out


def tcs_needed(want: NetdevDcb) -> int:
    return max([tc for tc, b in enumerate(want.tc_bw_pct) if b] + [0]) + 1


def foreign_apps(want: NetdevDcb | None, state) -> tuple[tuple[int, int], ...]:
    """DSCP entries for DSCPs shaperd does not plan on this netdev: left alone, reported."""
    wanted = dict(want.dscp_prio) if want is not None else {}
    return tuple(sorted((d, p) for d, ps in dscp_entries(state).items() if d not in wanted for p in ps))


def pfc_gaps(want: NetdevDcb, state) -> tuple[str, ...]:
    """Tenants whose priority has no PFC while PFC is on for others (RoCE there is not lossless). Read only."""
    pfc = state.pfc
    if pfc is None or not pfc.pfc_en:
        return ()
    on = set(pfc.priorities)
    return tuple(f"tenant {t.tenant} is on priority {t.priority} of {want.netdev}, which has no PFC (PFC is on for "
                 f"priorities {sorted(on)}: the fabric team's setting, not changed by shaperd)"
                 for t in want.tenants if t.priority not in on)


def diff(desired: DcbPlan, observed) -> list[TargetDiff]:
    out = []
    for want in desired.netdevs:
        err = observed.errors.get(want.netdev)
        state = observed.states.get(want.netdev)
        if err is not None or state is None:
            out.append(TargetDiff(want.netdev, error=err or f"{want.netdev} was not read"))
            continue
        out.append(diff_netdev(want, state, observed.stuck.get(want.netdev)))
    return out
