"""Per-pod bandwidth caps from the pod annotations the CNI bandwidth plugin and Cilium read.

``kubernetes.io/egress-bandwidth`` caps what one pod sends through the shaped uplinks;
``kubernetes.io/ingress-bandwidth`` what it receives on its host-side interface. The values are
Kubernetes resource quantities in bits per second ("100M" = 100,000,000 bit/s, "1Gi" = 2^30 bit/s,
"1.5M", "2e6"), read as the kubelet's ``ExtractPodBandwidthResources`` reads them: the grammar of
apimachinery's ``resource.ParseQuantity`` (no surrounding blanks, suffixes n u m "" k M G T P E,
Ki .. Ei, or an exponent e/E; "1E3" is 1000, "1E" one exa), the value exact (no floating point) and
rounded up to a whole number, refused below 1 kbit/s and above 1 Pbit/s.

shaperd refuses more than the kubelet does, because a cap it cannot honour is worse than none:
zero, negative values, a value above the capacity of the node's shaped uplinks, and a value that
holds two quantities ("100M,200M"). A refused value leaves the pod in its tenant, uncapped; the
reason is one of ``REASONS`` (the label of ``shaperd_pod_annotation_invalid_total``).

Where shaperd knowingly differs from ParseQuantity: "." and a lone sign, which ParseQuantity reads as
0, are refused as syntax rather than as zero; an exponent beyond int32, which ParseQuantity truncates
(so "1e4294967296" would read as 1), is refused as too large; a value that was not a string on the
wire (``NotAString``) is refused, never read as a number.

Owns the parser, the reasons and ``pod_caps`` (pods -> their caps and the refusals). Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import MAX_EMAX, MIN_EMIN, ROUND_CEILING, Context, Decimal

EGRESS_ANNOTATION = "kubernetes.io/egress-bandwidth"
INGRESS_ANNOTATION = "kubernetes.io/ingress-bandwidth"
ANNOTATIONS = (EGRESS_ANNOTATION, INGRESS_ANNOTATION)

# The kubelet's bounds (pkg/util/bandwidth: minRsrc 1k, maxRsrc 1P).
MIN_BPS = 1_000
MAX_BPS = 10**15

REASONS = ("syntax", "zero", "negative", "too_small", "too_large", "above_link", "multiple")

# apimachinery resource.Quantity: <signedNumber><suffix>; number: digits, digits.digits, digits. or .digits;
# suffix: binary SI, decimal SI (n u m k M G T P E, or none) or an exponent e/E<signed integer>.
_QUANTITY_RE = re.compile(
    r"(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<si>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE](?P<exp>[+-]?[0-9]+))?"
)
_DECIMAL_SI = {None: 0, "n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SI = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
# Separators that make one value two ("100M,200M", "100M 200M", "100M;200M").
_SEPARATORS_RE = re.compile(r"[\s,;|/]+")
# An exponent with more digits than this is beyond any annotation's mantissa: decided by its sign alone.
_EXP_DIGITS = 9
# How much of a refused value a message quotes (the rest is counted, not shown: values may be huge).
SHOWN_CHARS = 64


class NotAString(str):
    """An annotation value that was not a JSON string on the wire, kept as its JSON text.

    Discovery keeps it (instead of dropping it) so the pod's refusal is reported, and the parser refuses
    it: ``100`` (a JSON number) is not the quantity "100". Equal only to another NotAString of the same
    text, so a pod whose value changes between 100 and "100" changed.
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NotAString) and str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(("NotAString", str.__str__(self)))

    def __repr__(self) -> str:
        return f"NotAString({str.__repr__(self)})"


def shown(value: object) -> str:
    """A value as messages quote it: its repr (control characters escaped), at most SHOWN_CHARS of it."""
    text = str.__str__(value) if isinstance(value, str) else None
    r = repr(text) if text is not None else repr(value)
    if len(r) <= SHOWN_CHARS + 2:
        return r
    return f"{r[:SHOWN_CHARS]}... ({len(text if text is not None else r)} characters)"


class AnnotationError(ValueError):
    """A bandwidth annotation value shaperd refuses: ``reason`` is one of REASONS."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def quantity(text: str) -> Decimal | None:
    """The exact value of a Kubernetes quantity, or None where ``text`` is not one.

    Exact (Decimal with as many digits as the text needs) wherever the bounds could be in doubt; a value
    far outside them (about 1e17 and up, 1e-5 and below) comes back as a stand-in on the same side
    (1e18 or 1e-6, signed), so a huge exponent never builds a huge number."""
    m = _QUANTITY_RE.fullmatch(text)
    if m is None:
        return None
    mant = Decimal(m["num"])
    negative = m["sign"] == "-"
    if mant == 0:
        return Decimal(0)
    if m["exp"] is not None:
        digits = m["exp"].lstrip("+-").lstrip("0") or "0"
        if len(digits) > _EXP_DIGITS:  # beyond int32: decided by its sign (ParseQuantity would truncate it)
            big = not m["exp"].startswith("-")
            return _signed(Decimal("1e18") if big else Decimal("1e-18"), negative)
        exp10, exp2 = int(m["exp"]), 0
    elif m["si"] in _BINARY_SI:
        exp10, exp2 = 0, _BINARY_SI[m["si"]]
    else:
        exp10, exp2 = _DECIMAL_SI[m["si"]], 0
    magnitude = mant.adjusted() + exp10 + (exp2 * 3) // 10  # floor(log10) within one, cheap for any length
    if magnitude > 17:
        return _signed(Decimal("1e18"), negative)
    if magnitude < -5:
        return _signed(Decimal("1e-6"), negative)
    # Exact: enough digits for the whole mantissa times 2^60 or 10^±30, no exponent limit.
    ctx = Context(prec=len(m["num"]) + 40, Emax=MAX_EMAX, Emin=MIN_EMIN)
    value = ctx.multiply(ctx.scaleb(mant, exp10), Decimal(2) ** exp2)
    return _signed(value, negative)


def _signed(v: Decimal, negative: bool) -> Decimal:
    return -v if negative else v


def parse_bandwidth(value: object, link_bps: int | None = None) -> int:
    """A bandwidth annotation's value in bits per second (rounded up), or AnnotationError.

    ``link_bps``: the capacity of the node's shaped uplinks; a value above it is refused ("above_link").
    """
    if not isinstance(value, str):
        raise AnnotationError("syntax", f"expected a quantity such as '100M', got {shown(value)}")
    if isinstance(value, NotAString):
        raise AnnotationError("syntax", f"{shown(value)} is not a string on the wire (a JSON value of another "
                              "type); expected a quantity string such as '100M'")
    parts = [p for p in _SEPARATORS_RE.split(value) if p]
    if len(parts) > 1 and all(_QUANTITY_RE.fullmatch(p) for p in parts):
        raise AnnotationError("multiple", f"{shown(value)} holds {len(parts)} values; expected one quantity "
                              "such as '100M'")
    scaled = quantity(value)
    if scaled is None:
        hint = " (without surrounding blanks, as the kubelet reads it)" if value.strip() != value else ""
        raise AnnotationError("syntax", f"{shown(value)} is not a quantity{hint}; expected bits per second such "
                              "as '100M', '1.5G' or '512Ki'")
    if scaled < 0:
        raise AnnotationError("negative", f"{shown(value)} is negative; expected a rate above zero")
    if scaled == 0:
        raise AnnotationError("zero", f"{shown(value)} is zero: a pod that may send nothing is not a cap shaperd "
                              "applies; remove the annotation or give a rate")
    if scaled > MAX_BPS:
        raise AnnotationError("too_large", f"{shown(value)} is above 1 Pbit/s, the kubelet's bound")
    bps = int(scaled.to_integral_value(rounding=ROUND_CEILING))
    if bps < MIN_BPS:
        raise AnnotationError("too_small", f"{shown(value)} is below 1 kbit/s, the kubelet's bound")
    if link_bps is not None and bps > link_bps:
        raise AnnotationError("above_link", f"{shown(value)} is above the capacity of this node's shaped uplinks "
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
        return f"pod {self.ref}: annotation {self.key}={shown(self.value)} ignored ({self.reason}): {self.message}; " \
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
