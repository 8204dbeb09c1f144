"""The edt plan as the equivalent ``tc`` command lines, for ``shaperd plan``. Pure.

The stamper has no tc equivalent (shaperd builds its bytecode and maps): it is
shown as a comment with its parameters and the first rate per tenant, and each
capped pod's key, parent and static rate.
"""

from __future__ import annotations

from shaperd.core.units import format_rate
from shaperd.backends.common.objects import HANDLE_MAJOR, fmt_handle
from shaperd.backends.edt.plan import EdtPlan, initial_q16


def _fq(fq) -> str:
    return (f"fq limit {fq.limit_packets} flow_limit {fq.flow_limit_packets} horizon {fq.horizon_us}us "
            f"{'horizon_drop' if fq.horizon_drop else 'horizon_cap'}")


def render(p: EdtPlan) -> str:
    lines = []
    for dp in p.devices:
        lines.append(f"# edt on {dp.device} (capacity {format_rate(dp.capacity_bps)}, {dp.tx_queues} TX queues)")
        if dp.root_kind == "mq":
            lines.append(f"tc qdisc replace dev {dp.device} root handle {fmt_handle(dp.fqs[0].parent & 0xFFFF0000)} mq")
            for fq in dp.fqs:
                lines.append(f"tc qdisc replace dev {dp.device} parent {fmt_handle(fq.parent)} "
                             f"handle {fmt_handle(fq.handle)} {_fq(fq)}")
        else:
            lines.append(f"tc qdisc replace dev {dp.device} root handle {fmt_handle(dp.fqs[0].handle)} {_fq(dp.fqs[0])}")
        lines.append(f"tc qdisc add dev {dp.device} clsact  # if missing; shared, never removed")
        names = {s.key: s.tenant or "(no tenant)" for s in dp.shares}
        pod_keys = {p.key for p in dp.pods}
        first = ", ".join(f"{names.get(k, k)} {8_000_000_000 * 65536 // q // 1_000_000} Mbit/s"
                          for k, q in initial_q16(dp) if k not in pod_keys)
        lines.append(f"# edt stamper {dp.stamper.name} on clsact egress prio {dp.stamper.prio} (direct-action), "
                     f"horizon {dp.stamper.horizon_ns // 1_000_000} ms; first rates {first}; then the rate controller")
        for p in dp.pods:
            lines.append(f"#   pod {p.ref}: key {p.key} (class {fmt_handle(HANDLE_MAJOR << 16 | p.key)}), parent "
                         f"{names.get(p.parent, p.parent)} (key {p.parent}), rate {format_rate(p.rate_bps)} "
                         f"(cap {format_rate(p.cap_bps)}): paced by its own clock and its tenant's, the later wins")
    return "\n".join(lines) + ("\n" if lines else "")
