"""The desired rate groups as ``devlink port function rate`` command lines, pure.

The CLI takes bit units: a node's bytes/s are printed as ``<B/s x 8>bit``
(exact, no rounding), the same value the kernel receives in bytes/s.
"""

from __future__ import annotations

from shaperd.backends.devlink.objects import DevlinkPlan


def bits(Bps: int) -> str:
    return f"{Bps * 8}bit"


def render(desired: DevlinkPlan, vf_ports: dict[tuple[str, int], int] | None = None) -> str:
    """``vf_ports``: (devlink device, VF number) -> its port index, where known (else a placeholder)."""
    vf_ports = vf_ports or {}
    lines = []
    for n in desired.nodes:
        add = f"devlink port function rate add {n.instance}/{n.node}"
        if n.tx_share_Bps:
            add += f" tx_share {bits(n.tx_share_Bps)}"
        if n.tx_max_Bps:
            add += f" tx_max {bits(n.tx_max_Bps)}"
        lines.append(add)
        for vf in n.vfs:
            port = vf_ports.get((n.instance, vf.vf))
            where = str(port) if port is not None else f"<port of vf {vf.vf}>"
            lines.append(f"devlink port function rate set {n.instance}/{where} parent {n.node}")
    return "\n".join(lines) + ("\n" if lines else "")
