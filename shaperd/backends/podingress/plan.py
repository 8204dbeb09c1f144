"""Plan the per-pod ingress caps, pure: which host-side interface gets which tbf, and how it is sized.

A pod with ``kubernetes.io/ingress-bandwidth`` (Tenancy.pod_caps, core/podcaps.py) gets a tbf root qdisc
on its host-side interface (Pod.host_ifindex: the routed veth, or the bridge port of a bridged pod), so
what the node forwards towards the pod leaves that interface at most at the cap, as the CNI bandwidth
plugin does it. A pod of no tenant is capped too (the cap is the pod's, not its tenant's).

Not planned, each with a warning that names the pod: a hostNetwork pod (no interface of its own: its
traffic is the node's), a pod whose host interface is not resolved yet (retried next reconcile; where it
had one last time, that interface is held as it is), a pod whose host interface is a shaped uplink, and
pods that share one host interface (one tbf would cap them together).

Sizing (``tbf_for``), for a cap of R bytes per second:

- rate R: the annotation's bits per second / 8, rounded down (never above the cap);
- burst max(5 ms of R, 64 KiB), and at most what tc_tbf_qopt's u32 tick count can express. 64 KiB is one
  full GSO/GRO frame: tbf segments any larger packet, and drops a non-GSO packet larger than its bucket,
  so the bucket must take what a veth forwards at once. 5 ms of the rate absorbs the dequeue wake-ups a
  busy node delays (a bucket that fills while the qdisc waits keeps the rate). At 50 Mbit/s the floor
  rules: 64 KiB is 10.5 ms, the most the pod can receive above its cap after an idle spell;
- limit burst + 25 ms of R: the bytes queued behind the bucket, the CNI plugin's (and tc's ``latency``)
  25 ms. It holds a full GSO frame and enough for TCP to keep the queue non-empty without a drop every
  window, so a TCP receiver measures close to the cap (the payload share of a 1514-byte frame, 96 %),
  while the standing delay stays at 25 ms.

The CNI plugin as containerd's CRI drives it gets a burst of 2^32 - 1 bits (512 MiB, "unlimited" in its
code; the kubelet's old dockershim gave 2^31 - 1) for every annotated pod: over a 10 s test a 50M pod
receives its first 512 MiB at line rate. shaperd keeps the qdisc (tbf at the root, so a migrated pod is shaped the same way) and bounds the
burst.
"""

from __future__ import annotations

from shaperd.core.config import Config
from shaperd.core.inventory import Inventory
from shaperd.core.tenancy import Tenancy
from shaperd.backends.podingress.objects import Held, PodIngress, PodIngressPlan, TbfSpec

BURST_S_NUM, BURST_S_DEN = 5, 1000  # 5 ms of the cap
MIN_BURST_BYTES = 64 * 1024  # one full GSO frame
LATENCY_S_NUM, LATENCY_S_DEN = 25, 1000  # the queue: 25 ms of the cap, as the CNI plugin
MAX_U32 = 0xFFFFFFFF
# tc_tbf_qopt.buffer is u32 psched ticks (64 ns): a bucket longer than that in time cannot be said.
MAX_BUFFER_NS = MAX_U32 * 64


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tbf_for(cap_bps: int) -> TbfSpec:
    """The tbf shaperd writes for a cap of ``cap_bps`` bits per second (the module docstring says why)."""
    rate = max(1, cap_bps // 8)
    burst = max(MIN_BURST_BYTES, _ceil_div(rate * BURST_S_NUM, BURST_S_DEN))
    burst = min(burst, rate * MAX_BUFFER_NS // 1_000_000_000 - 1, MAX_U32)
    limit = min(burst + _ceil_div(rate * LATENCY_S_NUM, LATENCY_S_DEN), MAX_U32)
    return TbfSpec(rate_Bps=rate, burst_bytes=burst, limit_bytes=limit)


def plan(cfg: Config, inv: Inventory, ten: Tenancy, take_over: bool = False,
         remembered: dict[str, tuple[int, str]] | None = None) -> PodIngressPlan:
    """``remembered``: pod uid -> (ifindex, ifname) it was planned on before (the backend's memory, data)."""
    remembered = remembered or {}
    shaped = ten.uplink_names
    warnings: list[str] = []
    held: list[Held] = []
    by_if: dict[int, list[PodIngress]] = {}
    for pod in sorted(inv.pods, key=lambda p: p.uid):
        cap = ten.pod_caps.get(pod.uid)
        if cap is None or cap.ingress_bps is None:
            continue
        what = f"pod {pod.ref}: kubernetes.io/ingress-bandwidth={pod.ingress_bandwidth}"
        if pod.host_network:
            warnings.append(f"{what} is not enforced: a hostNetwork pod has no interface of its own (what it "
                            "receives is the node's traffic)")
            continue
        if pod.host_ifindex is None:
            why = "; ".join(pod.problems) or "its host interface is not known yet"
            warnings.append(f"{what} waits for the pod's host interface ({why}); retried next reconcile")
            if pod.uid in remembered:
                idx, name = remembered[pod.uid]
                held.append(Held(idx, name, pod.ref, why))
            continue
        if pod.host_ifname in shaped:
            warnings.append(f"{what} is not enforced: its host interface {pod.host_ifname} is a shaped uplink")
            continue
        by_if.setdefault(pod.host_ifindex, []).append(PodIngress(
            pod.host_ifindex, pod.host_ifname or str(pod.host_ifindex), pod.uid, pod.namespace, pod.name,
            cap.tenant, cap.ingress_bps, tbf_for(cap.ingress_bps)))
    out: list[PodIngress] = []
    for idx, group in sorted(by_if.items()):
        if len(group) > 1:
            warnings.append(f"pods {', '.join(p.ref for p in group)} share host interface {group[0].ifname}: a cap "
                            "there would cap them together; none of their ingress caps is enforced")
            continue
        out.append(group[0])
    claimed = {p.ifindex for p in out}
    return PodIngressPlan(pods=tuple(out), held=tuple(h for h in held if h.ifindex not in claimed),
                          warnings=tuple(warnings), take_over=take_over or cfg.node.take_over)
