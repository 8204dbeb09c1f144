"""The podingress backend's objects, as plain data: one tbf root qdisc per capped pod's host-side interface.

Pure: no I/O. What shaperd owns here is exactly one kind of object: a root qdisc of kind tbf with handle
7368: on a pod's host-side interface (``OWN_KIND``, ``ROOT_HANDLE``), recognisable from any dump. The
kernel's default root (noqueue on a veth) may be replaced; any other root qdisc is someone else's (the CNI
bandwidth plugin's tbf 1:, an operator's) and is left alone unless the operator asked to take over. The
``ingress`` qdisc and its filters (the CNI plugin's egress side, which redirects to a ``bwp*`` IFB) are
read to be reported, never written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shaperd.core.ids import HANDLE_MAJOR

ROOT_HANDLE = HANDLE_MAJOR << 16  # 7368:, the handle every shaperd qdisc has
OWN_KIND = "tbf"
TC_H_ROOT = 0xFFFFFFFF
# The ingress qdisc (handle ffff:, parent TC_H_INGRESS) and the parent its filters hang on.
INGRESS_KIND = "ingress"
INGRESS_FILTER_PARENT = 0xFFFF0000
# The CNI bandwidth plugin names its IFB "bwp" + a hash of the network and container id.
CNI_IFB_PREFIX = "bwp"
# psched ticks: 64 ns each (PSCHED_SHIFT 6), what tc_tbf_qopt.buffer counts.
NS_PER_TICK = 64
# Pseudo-target for what is not one interface (a read of the whole node that failed).
NODE_TARGET = "(pod interfaces)"


@dataclass(frozen=True)
class TbfSpec:
    """A tbf qdisc as shaperd sizes it (plan.py ``tbf_for``): what is written and compared."""

    rate_Bps: int  # the cap, bytes per second (the annotation's bits / 8, rounded down)
    burst_bytes: int  # the bucket
    limit_bytes: int  # the queue behind the bucket (bytes waiting for tokens)


@dataclass(frozen=True)
class PodIngress:
    """One capped pod's ingress cap on its host-side interface (egress towards the pod)."""

    ifindex: int
    ifname: str
    uid: str
    namespace: str
    name: str
    tenant: str | None  # None: a pod of no tenant
    cap_bps: int  # kubernetes.io/ingress-bandwidth, bits per second
    tbf: TbfSpec

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Held:
    """A capped pod whose host interface is not resolved this time, on the interface it had last time:
    whatever is there is left as it is (neither changed nor removed) until the pod resolves again."""

    ifindex: int
    ifname: str
    ref: str
    why: str


@dataclass(frozen=True)
class PodIngressPlan:
    pods: tuple[PodIngress, ...] = ()
    held: tuple[Held, ...] = ()
    problems: tuple = ()
    warnings: tuple[str, ...] = ()
    take_over: bool = False  # replace a root qdisc that is not shaperd's (node.takeOver or --take-over)


@dataclass(frozen=True)
class ObservedRoot:
    """The root qdisc of one interface as dumped: kind, handle, tbf parameters and counters."""

    ifindex: int
    kind: str
    handle: int
    tbf: object = None  # kernel.rtnl_rows.TbfParams, or None
    counters: object = None  # kernel.rtnl_rows.QdiscCounters, or None

    @property
    def owned(self) -> bool:
        return self.kind == OWN_KIND and self.handle == ROOT_HANDLE


@dataclass(frozen=True)
class CniEgress:
    """An ``ingress`` qdisc on a pod's host interface and the IFBs its filters redirect to: the CNI bandwidth
    plugin's shaping of what the pod sends (kubernetes.io/egress-bandwidth). Reported, never touched."""

    ifindex: int
    ifbs: tuple[str, ...] = ()  # the redirect targets' names ("bwp..."), or their ifindex as text
    error: str | None = None  # its filters could not be read


@dataclass
class PodIngressObserved:
    # ifindex -> its root qdisc, for every interface that has one (noqueue included where dumped)
    roots: dict[int, ObservedRoot] = field(default_factory=dict)
    # ifindex -> the ingress qdisc found there (planned pods' interfaces only)
    ingress: dict[int, CniEgress] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    # a read of the whole node that failed: nothing was diffed
    error: str | None = None
