"""Render the subnet manager's side of the tenants' service levels as OpenSM QoS options; pure.

What it owns: turning the tenants file and the RDMA plan (each tenant's SL)
into OpenSM's ``qos_*`` options (SL2VL, the two VL-arbitration tables, the
high-priority limit) for the fabric's ports, and checking that output
against the limits OpenSM itself applies (osm_subnet.c subn_verify_qos_set,
osm_qos.c qos_build_config). It does no I/O; writing the options file and
signalling opensm live in ``shaperd.rdma.opensm_host``.

The mapping (README "Service levels and the subnet manager"):
- A tenant's SL s goes to VL s when s < N (N data VLs, ``--max-vls``), else
  to the VL of its priority rank, min(rank, N-1): grouped, never VL15.
- Traffic of no tenant (unused SLs) goes to a default VL: VL0 when no tenant
  is on VL0, else the lowest free data VL, else the lowest-priority tenants' VL.
- VLs of the top priority rank go in the high-priority table (only when a
  lower rank exists); every other VL, the default one included, in the low
  table. Weights are in proportion to the guarantees on each VL (the
  default VL's share is node.reserve), in 64-byte credits, 1-255; multiples of
  64 (one 4 KiB MTU packet) where that keeps the ratios within 5 %.
- qos_high_limit = round(f / (1 - f)) blocks of 4 KiB, f = the top rank's
  share of all guarantees: served first, yet about its share when all VLs are
  busy. 255 (unbounded, starves the low table) is never rendered.
"""

from __future__ import annotations

import argparse

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping, Sequence

from shaperd.core.config import Config, default_reserve_bps
from shaperd.core.errors import ShaperdError
from shaperd.rdma.plan import RdmaPlan, derived_sl, priority_ranks

NUM_SLS = 16
MAX_DATA_VLS = 15  # VL0-VL14; VL15 is the subnet management VL
MANAGEMENT_VL = 15
MAX_WEIGHT = 255  # a VLArb weight is one byte, counted in 64-byte credits
MTU_CREDITS = 64  # one 4 KiB packet
MAX_VLARB_ENTRIES = 64  # OpenSM parses 2 blocks of 32 VL:weight pairs per table
TYPICAL_VLARB_CAP = 8  # VLArbLowCap/HighCap of ConnectX HCAs and of ibsim's ports
MAX_HIGH_LIMIT = 254  # 255 means "unbounded"
MAX_LINE = 1022  # OpenSM reads its options file with fgets(line, 1023): longer lines split in two
COARSE_TOLERANCE = Fraction(1, 20)
DEFAULT_MAX_VLS = 8  # VL0-7: what ConnectX HCAs and most switches operate

# The per-port-type parameter sets shaperd renders (OpenSM's qos_rtr_ set is left alone).
PORT_TYPES = ("ca", "swe", "sw0")
PARAMS = ("max_vls", "high_limit", "vlarb_high", "vlarb_low", "sl2vl")
OWNED_KEYS = frozenset(
    {"qos"} | {f"qos_{p}" for p in PARAMS} | {f"qos_{t}_{p}" for t in PORT_TYPES for p in PARAMS}
)

BEGIN_MARK = "# shaperd: begin qos"
END_MARK = "# shaperd: end qos"


class OpenSmConfigError(ShaperdError):
    """The rendered options break one of OpenSM's limits; nothing is printed or written."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"refusing to render OpenSM QoS options: {len(self.problems)} problem(s)\n{lines}")


@dataclass(frozen=True)
class QosTables:
    """One OpenSM QoS parameter set: what every port of one type is programmed with."""

    max_vls: int
    high_limit: int  # blocks of 4 KiB the high table may send before the low table gets a packet
    vlarb_high: tuple[tuple[int, int], ...]  # (VL, weight in 64-byte credits)
    vlarb_low: tuple[tuple[int, int], ...]
    sl2vl: tuple[int, ...]  # VL for SL 0..15

    def options(self, prefix: str = "qos") -> list[tuple[str, str]]:
        return [
            (f"{prefix}_max_vls", str(self.max_vls)),
            (f"{prefix}_high_limit", str(self.high_limit)),
            (f"{prefix}_vlarb_high", format_vlarb(self.vlarb_high)),
            (f"{prefix}_vlarb_low", format_vlarb(self.vlarb_low)),
            (f"{prefix}_sl2vl", ",".join(map(str, self.sl2vl))),
        ]


@dataclass(frozen=True)
class Lane:
    """One data VL and who is on it, for the explanation comments and status."""

    vl: int
    table: str  # "high" or "low"
    weight: int
    tenants: tuple[str, ...]
    sls: tuple[int, ...]
    default: bool = False  # traffic of no tenant (unused SLs) is here


@dataclass(frozen=True)
class TypeRender:
    tables: QosTables
    lanes: tuple[Lane, ...]


@dataclass(frozen=True)
class OpenSmConfig:
    default: TypeRender
    per_type: Mapping[str, TypeRender]  # every port type's effective set
    tenant_sls: Mapping[str, int]
    warnings: tuple[str, ...] = ()

    def tables(self, port_type: str | None = None) -> QosTables:
        """The effective tables of a port type (ca, swe, sw0), or the default set."""
        return (self.per_type[port_type] if port_type else self.default).tables

    def options(self) -> list[tuple[str, str]]:
        """``qos TRUE``, the default set, then the per-type keys that differ from it."""
        out = [("qos", "TRUE"), *self.default.tables.options()]
        base = dict(self.default.tables.options())
        for t in PORT_TYPES:
            for key, value in self.per_type[t].tables.options(f"qos_{t}"):
                if base[key.replace(f"qos_{t}_", "qos_", 1)] != value:
                    out.append((key, value))
        return out

    def text(self) -> str:
        """The options block with its marker comments, as written into OpenSM's options file."""
        lines = [f"{BEGIN_MARK} (written by `shaperd rdma opensm-config` from the tenants file; "
                 "edit that file, not these lines)"]
        for name in (None, *PORT_TYPES):
            render = self.default if name is None else self.per_type[name]
            if name is not None and render.tables == self.default.tables:
                continue
            where = "all ports" if name is None else f"{name} ports"
            lines.append(f"# {where}: {render.tables.max_vls} data VLs, high limit {render.tables.high_limit}")
            for lane in render.lanes:
                who = [f"{t} (SL{self.tenant_sls[t]})" for t in lane.tenants]
                if lane.default:
                    who.append("traffic of no tenant")
                lines.extend(_wrap(f"#   VL{lane.vl} {lane.table} weight {lane.weight}: ", who))
        lines.extend(f"{k} {v}" for k, v in self.options())
        lines.append(END_MARK)
        return "\n".join(lines) + "\n"


def _wrap(head: str, items: list[str], width: int = 116) -> list[str]:
    """Comment lines of at most ``width`` characters (OpenSM splits lines longer than it reads)."""
    out, line = [], head
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        if len(line) + len(piece) + 1 > width and line.strip() != "#":
            out.append(line.rstrip())
            line = "#     "
        line += piece + " "
    out.append(line.rstrip())
    return out


def format_vlarb(entries: Sequence[tuple[int, int]]) -> str:
    # An empty table is one skipped entry: OpenSM pads with 0:0, and "(null)" would mean "use my default".
    return ",".join(f"{vl}:{w}" for vl, w in entries) if entries else "0:0"


# ---------------------------------------------------------------- rendering


def render(cfg: Config, rplan: RdmaPlan, max_vls: int | Mapping[str, int] = DEFAULT_MAX_VLS) -> OpenSmConfig:
    """The QoS options for the tenants' SLs; raises OpenSmConfigError if OpenSM would not take them."""
    counts = {"default": max_vls} if isinstance(max_vls, int) else {"default": DEFAULT_MAX_VLS, **max_vls}
    problems = [f"--max-vls {k}: expected 1-{MAX_DATA_VLS} data VLs, got {n}"
                for k, n in counts.items() if not 1 <= n <= MAX_DATA_VLS]
    problems += [f"--max-vls: unknown port type {k!r}; expected one of {', '.join(PORT_TYPES)}"
                 for k in counts if k != "default" and k not in PORT_TYPES]
    if problems:
        raise OpenSmConfigError(problems)
    ranks = priority_ranks(cfg.tenants)
    sls = {t.tenant: t.service_level for t in rplan.tenants}
    missing = [t.name for t in cfg.tenants if t.name not in sls]
    if missing:
        raise OpenSmConfigError([f"tenant {n}: no service level in the RDMA plan" for n in missing])
    guarantee = {t.name: t.guarantee_bps for t in cfg.tenants}
    reserve = _reserve_bps(cfg)
    warnings: list[str] = []
    default = _render_type(counts["default"], sls, ranks, guarantee, reserve, warnings)
    per_type = {}
    for t in PORT_TYPES:
        n = counts.get(t, counts["default"])
        per_type[t] = default if n == counts["default"] else _render_type(n, sls, ranks, guarantee, reserve, warnings)
    by_sl: dict[int, list[str]] = {}
    for name, sl in sls.items():
        by_sl.setdefault(sl, []).append(name)
    for sl, names in sorted(by_sl.items()):
        if len({ranks[n] for n in names}) > 1:
            warnings.append(f"SL{sl} is held by tenants of different priorities ({', '.join(sorted(names))}): "
                            "they share one VL and its weight")
    out = OpenSmConfig(default=default, per_type=per_type, tenant_sls=dict(sorted(sls.items())),
                       warnings=tuple(dict.fromkeys(warnings)))
    problems = validate(out.options())
    problems += [f"line {i + 1} of the options block is {len(l)} characters; OpenSM reads at most {MAX_LINE}"
                 for i, l in enumerate(out.text().splitlines()) if len(l) > MAX_LINE]
    if problems:
        raise OpenSmConfigError(problems)
    return out


def _reserve_bps(cfg: Config) -> int:
    """The default VL's share: node.reserve, else 1 % of node.capacity, else 1 % of the guarantees."""
    if cfg.node.reserve_bps is not None:
        return cfg.node.reserve_bps
    if cfg.node.capacity_bps is not None:
        return default_reserve_bps(cfg.node.capacity_bps)
    return default_reserve_bps(sum(t.guarantee_bps for t in cfg.tenants))


def sl_to_vl(sl: int, rank: int, n: int) -> int:
    """A tenant's SL on a fabric of n data VLs: its own VL where there is one, else its rank's (grouped)."""
    return sl if sl < n else derived_sl(rank, n)


def _render_type(n: int, sls: Mapping[str, int], ranks: Mapping[str, int], guarantee: Mapping[str, int],
                 reserve: int, warnings: list[str]) -> TypeRender:
    # One VL per SL: an SL shared by tenants of different ranks goes with its best rank.
    sl_rank: dict[int, int] = {}
    for name, sl in sls.items():
        sl_rank[sl] = min(sl_rank.get(sl, ranks[name]), ranks[name])
    sl_vl = {sl: sl_to_vl(sl, r, n) for sl, r in sl_rank.items()}
    tenants_on: dict[int, list[str]] = {}
    for name in sorted(sls, key=lambda x: (sls[x], x)):
        tenants_on.setdefault(sl_vl[sls[name]], []).append(name)
    vl_rank = {vl: min(ranks[t] for t in names) for vl, names in tenants_on.items()}
    if len(set(sl_vl)) > len(set(sl_vl.values())):
        warnings.append(f"{len(set(sl_vl))} tenant SLs on {n} data VLs: some tenants share a VL (grouped by rank)")
    free = [vl for vl in range(n) if vl not in tenants_on]
    if 0 not in tenants_on:
        default_vl = 0
    elif free:
        default_vl = free[0]
    else:
        default_vl = max(tenants_on, key=lambda vl: (vl_rank[vl], vl))
        warnings.append(f"no free data VL for traffic of no tenant on {n} data VLs: unused SLs share VL{default_vl} "
                        f"with {', '.join(tenants_on[default_vl])}")
    sl2vl = tuple(sl_vl.get(sl, default_vl) for sl in range(NUM_SLS))
    share = {vl: sum(guarantee[t] for t in names) for vl, names in tenants_on.items()}
    share[default_vl] = share.get(default_vl, 0) + reserve
    # The top rank is served first only where a lower rank exists; the default VL is never in the high
    # table (it is VL0 only when no tenant is, else a free VL or the lowest rank's).
    high_vls = {vl for vl, r in vl_rank.items() if r == 0} if len(set(vl_rank.values())) > 1 else set()
    low_vls = set(share) - high_vls
    high_w = weights({vl: share[vl] for vl in high_vls})
    low_w = weights({vl: share[vl] for vl in low_vls})
    total = sum(share.values())
    f = Fraction(sum(share[vl] for vl in high_vls), total) if total else Fraction(0)
    high_limit = 0 if not high_vls or f == 0 else (MAX_HIGH_LIMIT if f == 1 else
                                                  min(MAX_HIGH_LIMIT, _round(f / (1 - f))))
    for table, entries in (("high", high_w), ("low", low_w)):
        if len(entries) > TYPICAL_VLARB_CAP:
            warnings.append(f"the {table} VL arbitration table has {len(entries)} entries; ports with a capacity of "
                            f"{TYPICAL_VLARB_CAP} (ConnectX HCAs) program only the first {TYPICAL_VLARB_CAP}")
    lanes = tuple(
        Lane(vl=vl, table="high" if vl in high_vls else "low", weight=(high_w | low_w)[vl],
             tenants=tuple(tenants_on.get(vl, ())), sls=tuple(s for s in range(NUM_SLS) if sl2vl[s] == vl),
             default=vl == default_vl)
        for vl in sorted(share)
    )
    tables = QosTables(max_vls=n, high_limit=high_limit, vlarb_high=tuple(sorted(high_w.items())),
                       vlarb_low=tuple(sorted(low_w.items())), sl2vl=sl2vl)
    return TypeRender(tables=tables, lanes=lanes)


def _round(x: Fraction) -> int:
    return int(x + Fraction(1, 2))  # half up; int() floors a non-negative Fraction


def weights(shares: Mapping[int, int]) -> dict[int, int]:
    """VL -> weight in 64-byte credits, in proportion to its share (bit/s); every VL gets at least 1.

    Multiples of 64 (whole 4 KiB packets, 64-192) when they keep every ratio
    within 5 %; otherwise the largest share gets 255 and the others their
    proportion of it, rounded.
    """
    if not shares:
        return {}
    top = max(shares.values())
    if top <= 0:
        return {vl: MTU_CREDITS for vl in shares}
    for k in (1, 2, 3):  # 4 * 64 = 256 does not fit a byte
        exact = {vl: Fraction(k * s, top) for vl, s in shares.items()}
        units = {vl: _round(x) for vl, x in exact.items()}
        if all(u >= 1 and abs(u - exact[vl]) <= COARSE_TOLERANCE * exact[vl] for vl, u in units.items()):
            return {vl: MTU_CREDITS * u for vl, u in units.items()}
    return {vl: max(1, _round(Fraction(MAX_WEIGHT * s, top))) for vl, s in shares.items()}


# ---------------------------------------------------------------- validation against OpenSM's limits

_INT_RE = re.compile(r"^(0|[1-9][0-9]*|0[xX][0-9a-fA-F]+)$")


def _int(text: str) -> int | None:
    return int(text, 0) if _INT_RE.match(text) else None


def validate(options: Sequence[tuple[str, str]]) -> list[str]:
    """Every way these options break OpenSM's limits, each naming the key; [] when OpenSM takes them as meant.

    Stricter than OpenSM where OpenSM would silently change the meaning
    (it takes VL % 15, truncates weights to a byte, pads short tables, drops
    an SL mapped to VL15).
    """
    problems: list[str] = []
    given: dict[str, str] = {}
    for key, value in options:
        if key not in OWNED_KEYS:
            problems.append(f"{key}: not a QoS option shaperd renders")
            continue
        if key in given:
            problems.append(f"{key}: given twice (OpenSM would take the last)")
        given[key] = value
        width = len(key) + 1 + len(value)
        if width > MAX_LINE:
            problems.append(f"{key}: the line is {width} characters; OpenSM reads at most {MAX_LINE}")
    if given.get("qos") != "TRUE":
        problems.append(f"qos: expected TRUE (OpenSM ignores every qos_* option otherwise), got {given.get('qos')!r}")
    parsed: dict[str, dict[str, object]] = {}
    for prefix in ("qos", *(f"qos_{t}" for t in PORT_TYPES)):
        mine: dict[str, object] = {}
        for p in PARAMS:
            key = f"{prefix}_{p}"
            if key in given:
                value = _check_param(key, p, given[key], problems)
                if value is not None:
                    mine[p] = value
        parsed[prefix] = mine
    base = parsed["qos"]
    for p in PARAMS:
        if p not in base:
            problems.append(f"qos_{p}: missing; shaperd renders the whole default set")
    for prefix in ("qos", *(f"qos_{t}" for t in PORT_TYPES)):
        eff = {**base, **parsed[prefix]}  # OpenSM falls back to the default set key by key
        if not all(p in eff for p in PARAMS):
            continue
        n = eff["max_vls"]
        used = set(eff["sl2vl"])
        for vl in sorted(used):
            if vl >= n:
                problems.append(f"{prefix}_sl2vl: VL{vl} is not one of the {n} data VLs of {prefix}_max_vls")
        for table in ("vlarb_high", "vlarb_low"):
            for vl, _ in eff[table]:
                if vl >= n:
                    problems.append(f"{prefix}_{table}: VL{vl} is not one of the {n} data VLs of {prefix}_max_vls")
        served = {vl for vl, w in (*eff["vlarb_high"], *eff["vlarb_low"]) if w > 0}
        for vl in sorted(used - served):
            sls = [str(s) for s, v in enumerate(eff["sl2vl"]) if v == vl]
            problems.append(f"{prefix}: VL{vl} (SL {','.join(sls)}) has no weight in either arbitration table: "
                            "its packets would never be sent")
    return problems


def _check_param(key: str, param: str, value: str, problems: list[str]):
    if param in ("max_vls", "high_limit"):
        n = _int(value)
        lo, hi = (1, MAX_DATA_VLS) if param == "max_vls" else (0, 255)
        if n is None or not lo <= n <= hi:
            problems.append(f"{key}: expected a whole number {lo}-{hi}, got {value!r}")
            return None
        return n
    if param == "sl2vl":
        parts = value.split(",")
        vls = [_int(p) for p in parts]
        bad = [f"{parts[i]!r}" for i, v in enumerate(vls) if v is None or not 0 <= v <= MANAGEMENT_VL]
        if bad:
            problems.append(f"{key}: expected VL numbers 0-14, got {', '.join(bad)}")
            return None
        if len(vls) != NUM_SLS:
            problems.append(f"{key}: expected exactly {NUM_SLS} VLs (one per SL), got {len(vls)}")
            return None
        fifteen = [str(s) for s, v in enumerate(vls) if v == MANAGEMENT_VL]
        if fifteen:
            problems.append(f"{key}: SL {','.join(fifteen)} mapped to VL15, the management VL: "
                            "OpenSM drops those packets")
            return None
        return tuple(vls)
    entries = value.split(",")
    if len(entries) > MAX_VLARB_ENTRIES:
        problems.append(f"{key}: {len(entries)} VL:weight pairs; OpenSM takes at most {MAX_VLARB_ENTRIES}")
        return None
    out = []
    for i, e in enumerate(entries):
        vl_s, sep, w_s = e.partition(":")
        vl, w = _int(vl_s), _int(w_s)
        if not sep or vl is None or w is None:
            problems.append(f"{key}: entry {i + 1} {e!r}: expected VL:weight such as 1:64")
        elif not 0 <= vl < MAX_DATA_VLS:
            problems.append(f"{key}: entry {i + 1} {e!r}: VL {vl} out of range; expected a data VL 0-14")
        elif not 0 <= w <= MAX_WEIGHT:
            problems.append(f"{key}: entry {i + 1} {e!r}: weight {w} out of range; expected 0-255 (64-byte credits)")
        else:
            out.append((vl, w))
            continue
        return None
    return tuple(out)


def max_vls_arg(text: str) -> tuple[str, int]:
    """``--max-vls N|TYPE=N`` (argparse type): the data VLs of the default or one port type."""
    kind, sep, num = text.rpartition("=")
    kind = kind if sep else "default"
    if kind != "default" and kind not in PORT_TYPES:
        raise argparse.ArgumentTypeError(f"unknown port type {kind!r} in {text!r}; expected N or TYPE=N with TYPE "
                                         f"one of {', '.join(PORT_TYPES)}")
    if not num.isdigit() or not 1 <= int(num) <= MAX_DATA_VLS:
        raise argparse.ArgumentTypeError(f"expected 1-{MAX_DATA_VLS} data VLs (VL0-VL14; VL15 is the "
                                         f"management VL), got {num!r}")
    return kind, int(num)

