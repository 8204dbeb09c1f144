"""Render the VF-rate plan as the equivalent ``ip link`` commands (``shaperd plan``). Pure: no I/O."""

from __future__ import annotations

from shaperd.backends.vfrate.plan import VfPlan


def render(p: VfPlan) -> str:
    if not p.vfs:
        return ""
    lines = ["# SR-IOV VF rates (Mbit/s): guarantee and limit split equally over each tenant's VFs on this node"]
    for pf, why in sorted(p.degraded.items()):
        lines.append(f"# {pf}: limit only, the driver refused a minimum ({why})")
    for v in p.vfs:
        lines.append(f"# tenant {v.tenant}: VF {v.vf} of {v.pf} = {v.pci} ({v.device})")
        lines.append(f"ip link set dev {v.pf} vf {v.vf} min_tx_rate {v.min_mbps} max_tx_rate {v.max_mbps}")
    return "\n".join(lines) + "\n"
