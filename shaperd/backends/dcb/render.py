"""Render the DCB plan as the equivalent iproute2 ``dcb`` command lines. Pure: no I/O.

For ``shaperd plan`` and golden tests; enforcement speaks DCB netlink
(kernel/dcb.py). Max rates are written ``Nkbit``, the unit the uapi means;
iproute2 6.1 sends such a rate 125 times too large (it passes bytes/s on
unconverted, tests/unit/test_dcb_bytes.py shows it): with that ``dcb`` the
same bytes as shaperd's come from ``Nbps``, which the comment line gives.
"""

from __future__ import annotations

from shaperd.core.units import format_rate
from shaperd.backends.dcb.plan import DcbPlan, NetdevDcb

TSA_NAMES = {0: "strict", 1: "cbs", 2: "ets", 255: "vendor"}


def netdev_commands(n: NetdevDcb) -> list[list[str]]:
    """argv lists (after ``dcb``) that set ``n``'s ETS, max rates and DSCP APP entries."""
    tsa = {TSA_NAMES.get(t, str(t)) for t in n.tc_tsa}
    if len(tsa) == 1:
        tsa_args = [f"all:{tsa.pop()}"]
    else:
        tsa_args = [f"{tc}:{TSA_NAMES.get(t, t)}" for tc, t in enumerate(n.tc_tsa)]
    cmds = [["ets", "set", "dev", n.netdev, "tc-tsa", *tsa_args,
             "tc-bw", *(f"{tc}:{b}" for tc, b in enumerate(n.tc_bw_pct)),
             "prio-tc", *(f"{p}:{tc}" for p, tc in enumerate(n.prio_tc))],
            ["maxrate", "set", "dev", n.netdev, "tc-maxrate",
             *(f"{tc}:{r}kbit" if r else f"{tc}:0" for tc, r in enumerate(n.maxrate_kbps))]]
    if n.dscp_prio:
        cmds.append(["app", "add", "dev", n.netdev, "dscp-prio", *(f"{d}:{p}" for d, p in n.dscp_prio)])
    return cmds


def render(p: DcbPlan) -> str:
    lines = []
    for n in p.netdevs:
        who = ", ".join(f"{t.tenant} TC{t.tc} {t.share_pct}%" for t in n.tenants)
        lines.append(f"# DCB on {n.netdev} (capacity {format_rate(n.capacity_bps)}): {who}")
        for argv in netdev_commands(n):
            lines.append("dcb " + " ".join(argv))
        if any(n.maxrate_kbps):
            lines.append("# iproute2 6.1 dcb sends tc-maxrate unconverted bytes/s: there write "
                         + " ".join(f"{tc}:{r}bps" for tc, r in enumerate(n.maxrate_kbps) if r))
    return "\n".join(lines) + ("\n" if lines else "")
