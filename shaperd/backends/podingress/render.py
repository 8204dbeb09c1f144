"""The pod ingress caps as the equivalent ``tc`` command lines, for ``shaperd plan``. Pure.

The same request shaperd sends (kernel_tc.py): tc given rate, burst and limit in bytes sends it byte for byte.
"""

from __future__ import annotations

from shaperd.backends.podingress.objects import PodIngressPlan


def render(p: PodIngressPlan) -> str:
    if not p.pods:
        return ""
    lines = ["# pod ingress caps (kubernetes.io/ingress-bandwidth): tbf at the root of each pod's host interface"]
    for x in p.pods:
        t = x.tbf
        lines.append(f"# pod {x.ref} (tenant {x.tenant or '-'}): {x.cap_bps} bit/s")
        lines.append(f"tc qdisc replace dev {x.ifname} root handle 7368: tbf rate {t.rate_Bps * 8}bit "
                     f"burst {t.burst_bytes} limit {t.limit_bytes}")
    return "\n".join(lines) + "\n"
