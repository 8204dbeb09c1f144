"""Per-pod bandwidth caps from the pod annotations the CNI bandwidth plugin and Cilium read.

``kubernetes.io/egress-bandwidth`` caps what one pod sends through the shaped uplinks;
``kubernetes.io/ingress-bandwidth`` what it receives on its host-side interface. The values are
Kubernetes resource quantities in bits per second ("100M" = 100,000,000 bit/s, "1Gi" = 2^30 bit/s,
"1.5M", "2e6"), read as the kubelet's ``ExtractPodBandwidthResources`` reads them: the quantity's
value rounded up to a whole number, refused below 1 kbit/s and above 1 Pbit/s.

shaperd refuses more than the kubelet does, because a cap it cannot honour is worse than none:
zero, negative values, a value above the capacity of the node's shaped uplinks, and a value that
holds two quantities ("100M,200M"). A refused value leaves the pod in its tenant, uncapped; the
reason is one of ``REASONS`` (the label of ``shaperd_pod_annotation_invalid_total``).

Owns the parser, the reasons and ``pod_caps`` (pods -> their caps and the refusals). Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

EGRESS_ANNOTATION = "kubernetes.io/egress-bandwidth"
INGRESS_ANNOTATION = "kubernetes.io/ingress-bandwidth"
ANNOTATIONS = (EGRESS_ANNOTATION, INGRESS_ANNOTATION)

# The kubelet's bounds (pkg/util/bandwidth: minRsrc 1k, maxRsrc 1P).
MIN_BPS = 1_000
MAX_BPS = 10**15

REASONS = ("syntax", "zero", "negative", "too_small", "too_large", "above_link", "multiple")

# Kubernetes resource.Quantity: <signedNumber><suffix>, suffix binary SI, decimal SI or an exponent.
_QUANTITY_RE = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<si>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)|[eE](?P<exp>[+-]?[0-9]+))?$"
)
_SUFFIX = {
    None: Decimal(1), "m": Decimal("0.001"), "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}
# Separators that make one value two ("100M,200M", "100M 200M", "100M;200M").
_SEPARATORS_RE = re.compile(r"[\s,;|/]+")


class AnnotationError(ValueError):
    """A bandwidth annotation value shaperd refuses: ``reason`` is one of REASONS."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def parse_bandwidth(value: object, link_bps: int | None = None) -> int:
    """A bandwidth annotation's value in bits per second (rounded up), or AnnotationError.

    ``link_bps``: the capacity of the node's shaped uplinks; a value above it is refused ("above_link").
    """
    if not isinstance(value, str):
        raise AnnotationError("syntax", f"expected a quantity such as '100M', got {value!r}")
    text = value.strip()
    parts = [p for p in _SEPARATORS_RE.split(text) if p]
    if len(parts) > 1:
        raise AnnotationError("multiple", f"{value!r} holds {len(parts)} values; expected one quantity such as '100M'")
    m = _QUANTITY_RE.match(text)
    if not m:
        raise AnnotationError("syntax", f"{value!r} is not a quantity; expected bits per second such as "
                              "'100M', '1.5G' or '512Ki'")
    num = Decimal(m["num"])
    exp = int(m["exp"]) if m["exp"] is not None else 0
    if num and exp > 30:  # far above any bound: no need to build the number
        raise AnnotationError("negative" if num < 0 else "too_large",
                              f"{value!r} is {'negative' if num < 0 else 'above 1 Pbit/s, the kubelet bound'}")
    exp = max(exp, -30)  # far below any bound rounds to the same refusal
    scaled = num * (Decimal(10) ** exp if m["exp"] is not None else _SUFFIX[m["si"]])
    if scaled < 0:
        raise AnnotationError("negative", f"{value!r} is negative; expected a rate above zero")
    if scaled == 0:
        raise AnnotationError("zero", f"{value!r} is zero: a pod that may send nothing is not a cap shaperd "
                              "applies; remove the annotation or give a rate")
    if scaled > MAX_BPS:
        raise AnnotationError("too_large", f"{value!r} is above 1 Pbit/s, the kubelet's bound")
    bps = int(scaled.to_integral_value(rounding=ROUND_CEILING))
    if bps < MIN_BPS:
        raise AnnotationError("too_small", f"{value!r} is below 1 kbit/s, the kubelet's bound")
    if link_bps is not None and bps > link_bps:
        raise AnnotationError("above_link", f"{value!r} is above the capacity of this node's shaped uplinks "
                              f"({link_bps} bit/s)")
    return bps


@dataclass(frozen=True)
class PodCap:
    """One pod's caps, in bits per second (None: that direction is not capped)."""

    uid: str
    ref: str  # namespace/name
    tenant: str | None  # None: a pod of no tenant (capped in the default class)
    egress_bps: int | None = None
    ingress_bps: int | None = None


@dataclass(frozen=True)
class InvalidAnnotation:
    """A refused annotation value: named by pod, key and value, with its reason (one of REASONS)."""

    uid: str
    ref: str
    key: str
    value: str
    reason: str
    message: str

    def warning(self) -> str:
        return f"pod {self.ref}: annotation {self.key}={self.value!r} ignored ({self.reason}): {self.message}; " \
               "the pod stays in its tenant, uncapped in that direction"


def pod_caps(pods, pod_tenants: dict[str, str], link_bps: int | None) -> tuple[
        dict[str, PodCap], tuple[InvalidAnnotation, ...]]:
    """uid -> PodCap for every pod with at least one valid cap, and every refused value (in pod order)."""
    caps: dict[str, PodCap] = {}
    invalid: list[InvalidAnnotation] = []
    for pod in sorted(pods, key=lambda p: p.uid):
        got: dict[str, int] = {}
        for key, raw in ((EGRESS_ANNOTATION, pod.egress_bandwidth), (INGRESS_ANNOTATION, pod.ingress_bandwidth)):
            if raw is None:
                continue
            try:
                got[key] = parse_bandwidth(raw, link_bps)
            except AnnotationError as e:
                invalid.append(InvalidAnnotation(pod.uid, pod.ref, key, str(raw), e.reason, str(e)))
        if got:
            caps[pod.uid] = PodCap(pod.uid, pod.ref, pod_tenants.get(pod.uid),
                                   egress_bps=got.get(EGRESS_ANNOTATION), ingress_bps=got.get(INGRESS_ANNOTATION))
    return caps, tuple(invalid)
