"""Validation: a parsed document to a Config, collecting every problem with its field path.

Nothing touches the kernel until the whole file is valid. Checks that need the node (a link's
reported speed) live in the planner. Pure.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from shaperd.core.config import limits as config_limits
from shaperd.core.config.model import (
    Config, DATAPLANES, Destination, HTB_OFFLOAD_MODES, IPNetwork, Ingress, Match, Node, Rdma, RdmaDeviceRef, Tenant,
    check_guarantee_sum, check_ingress_sum,
)
from shaperd.core.config.model import IFNAME_GLOB_RE as _IFNAME_GLOB_RE, NAME_RE as _NAME_RE
from shaperd.core.errors import ConfigError, ConfigProblem
from shaperd.core.units import UnitError, format_rate, parse_rate

def from_dict(doc: Any, source: str = "<memory>", prefix: str = "") -> Config:
    v = _Validator(prefix)
    cfg = v.config(doc)
    if v.problems:
        raise ConfigError(source, v.problems)
    assert cfg is not None
    return Config(node=cfg.node, tenants=cfg.tenants, source=source)


_TOP_KEYS = {"tenants", "node"}
_NODE_KEYS = {"interfaces", "capacity", "reserve", "takeOver", "markMask", "dataplane", "htbOffload"}
_TENANT_KEYS = {"name", "bandwidthGuarantee", "bandwidthLimit", "priority", "match", "rdma", "destinations",
                "priorityFrom", "ingress"}
_INGRESS_KEYS = {"bandwidthGuarantee", "bandwidthLimit"}
PRIORITY_FROM = ("volcanoQueue",)
_DEST_KEYS = {"cidrs", "bandwidthLimit"}
_RDMA_KEYS = {"devices", "serviceLevel", "trafficClass", "nccl"}
_RDMA_DEV_RE = re.compile(r"^(?P<name>[A-Za-z0-9_.-]{1,63})(:(?P<port>[0-9]{1,3}))?$")
_PCI_RE = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_NCCL_KEY_RE = re.compile(r"^NCCL_[A-Z0-9_]+$")
# Managed by shaperd from rdma.devices/serviceLevel/trafficClass: a passthrough value would contradict them.
_NCCL_DERIVED = {"NCCL_IB_HCA", "NCCL_IB_SL", "NCCL_IB_TC"}
_MATCH_KEYS = {"cidrs", "interfaces", "podLabels", "namespaces", "cgroups", "volcanoQueues"}


class _Validator:
    """Walks the document once, recording every problem with its path."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.problems: list[ConfigProblem] = []

    def bad(self, path: str, message: str) -> None:
        self.problems.append(ConfigProblem(self.prefix + path, message))

    def keys(self, obj: dict, allowed: set[str], path: str) -> None:
        for k in obj:
            if k not in allowed:
                where = f"{path}.{k}" if path else str(k)
                self.bad(where, f"unknown key; expected one of {', '.join(sorted(allowed))}")

    def mapping(self, obj: Any, path: str) -> dict | None:
        if obj is None:
            return {}
        if not isinstance(obj, dict):
            self.bad(path, f"expected a mapping, got {type(obj).__name__}")
            return None
        return obj

    def str_list(self, obj: Any, path: str) -> list[str]:
        if obj is None:
            return []
        if not isinstance(obj, list) or not all(isinstance(x, str) and x for x in obj):
            self.bad(path, "expected a list of non-empty strings")
            return []
        return obj

    def rate(self, obj: Any, path: str, required: bool) -> int | None:
        if obj is None:
            if required:
                self.bad(path, "required; expected a rate such as '40Gbps'")
            return None
        try:
            return parse_rate(obj)
        except UnitError as e:
            self.bad(path, str(e))
            return None

    def config(self, doc: Any) -> Config | None:
        if not isinstance(doc, dict):
            self.bad("", f"expected a mapping with a 'tenants' list, got {type(doc).__name__}")
            return None
        self.keys(doc, _TOP_KEYS, "")
        node = self.node(doc.get("node"))
        raw = doc.get("tenants")
        tenants: list[tuple[int, Tenant]] = []  # (index in the file, tenant) for field paths
        if not isinstance(raw, list) or not raw:
            self.bad("tenants", "required; expected a non-empty list of tenants")
            raw = []
        if not config_limits.check_tenant_count(raw, self.bad):
            raw = []
        seen: dict[str, int] = {}
        for i, t in enumerate(raw):
            tenant = self.tenant(t, f"tenants[{i}]")
            if tenant is None:
                continue
            if tenant.name in seen:
                self.bad(f"tenants[{i}].name", f"duplicate tenant name {tenant.name!r} (also tenants[{seen[tenant.name]}])")
                continue
            seen[tenant.name] = i
            tenants.append((i, tenant))
        self.cross_checks(node, tenants)
        return Config(node=node, tenants=tuple(t for _, t in tenants))

    def node(self, obj: Any) -> Node:
        m = self.mapping(obj, "node")
        if m is None:
            return Node()
        self.keys(m, _NODE_KEYS, "node")
        ifaces = self.str_list(m.get("interfaces"), "node.interfaces")
        for j, name in enumerate(ifaces):
            if not _IFNAME_GLOB_RE.match(name):
                self.bad(f"node.interfaces[{j}]", f"{name!r} is not an interface name or glob (max 15 characters)")
        take_over = m.get("takeOver", False)
        if not isinstance(take_over, bool):
            self.bad("node.takeOver", "expected true or false")
            take_over = False
        mask = m.get("markMask", 0x7F)
        if isinstance(mask, bool) or not isinstance(mask, int) or not 0 < mask <= 0xFFFFFFFF or not _contiguous(mask):
            self.bad("node.markMask", f"expected a contiguous non-zero 32-bit mask such as 0x7f, got {mask!r}")
            mask = 0x7F
        dataplane = m.get("dataplane", "htb")
        if dataplane not in DATAPLANES:
            self.bad("node.dataplane", f"expected one of {', '.join(DATAPLANES)}, got {dataplane!r}")
            dataplane = "htb"
        htb_offload = m.get("htbOffload", "auto")
        if isinstance(htb_offload, bool):  # YAML 1.1 reads an unquoted on/off as true/false
            htb_offload = "on" if htb_offload else "off"
        if htb_offload not in HTB_OFFLOAD_MODES:
            self.bad("node.htbOffload", f"expected one of {', '.join(HTB_OFFLOAD_MODES)}, got {htb_offload!r}")
            htb_offload = "auto"
        return Node(
            mark_mask=mask,
            dataplane=dataplane,
            htb_offload=htb_offload,
            interfaces=tuple(ifaces),
            capacity_bps=self.rate(m.get("capacity"), "node.capacity", required=False),
            reserve_bps=self.rate(m.get("reserve"), "node.reserve", required=False),
            take_over=take_over,
        )

    def tenant(self, obj: Any, path: str) -> Tenant | None:
        m = self.mapping(obj, path)
        if not m:
            if m is not None:
                self.bad(path, "expected a tenant with name, bandwidthGuarantee and priority")
            return None
        before = len(self.problems)
        self.keys(m, _TENANT_KEYS, path)
        name = m.get("name")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            self.bad(f"{path}.name", "required; expected 1-63 letters, digits, '-', '_' or '.', starting and ending alphanumeric")
            name = None
        guarantee = self.rate(m.get("bandwidthGuarantee"), f"{path}.bandwidthGuarantee", required=True)
        limit = self.rate(m.get("bandwidthLimit"), f"{path}.bandwidthLimit", required=False)
        if guarantee is not None and limit is not None and guarantee > limit:
            self.bad(
                f"{path}.bandwidthGuarantee",
                f"guarantee {format_rate(guarantee)} is above the limit {format_rate(limit)}; expected guarantee <= limit",
            )
        prio = m.get("priority", 0)
        if isinstance(prio, bool) or not isinstance(prio, int) or prio < 0:
            self.bad(f"{path}.priority", f"expected a whole number >= 0 (larger is more important), got {prio!r}")
            prio = 0
        match = self.match(m.get("match"), f"{path}.match")
        rdma = self.rdma(m.get("rdma"), f"{path}.rdma")
        dests = self.destinations(m.get("destinations"), f"{path}.destinations")
        ingress = self.ingress(m.get("ingress"), f"{path}.ingress") if "ingress" in m else None
        pfrom = m.get("priorityFrom")
        if pfrom is not None and pfrom not in PRIORITY_FROM:
            self.bad(f"{path}.priorityFrom", f"expected one of {', '.join(PRIORITY_FROM)}, got {pfrom!r}")
        elif pfrom == "volcanoQueue" and not match.volcano_queues:
            self.bad(f"{path}.priorityFrom", "volcanoQueue needs match.volcanoQueues")
        if len(self.problems) != before or name is None or guarantee is None:
            return None
        return Tenant(name=name, guarantee_bps=guarantee, limit_bps=limit, priority=prio, match=match, rdma=rdma,
                      destinations=dests, priority_from=pfrom, ingress=ingress)

    def ingress(self, obj: Any, path: str) -> Ingress | None:
        m = self.mapping(obj, path)
        if m is None:
            return None
        before = len(self.problems)
        self.keys(m, _INGRESS_KEYS, path)
        guarantee = self.rate(m.get("bandwidthGuarantee"), f"{path}.bandwidthGuarantee", required=False)
        limit = self.rate(m.get("bandwidthLimit"), f"{path}.bandwidthLimit", required=False)
        if guarantee is None and limit is None:
            if len(self.problems) == before:  # {} or only nulls: a block that asks for nothing is a mistake
                self.bad(path, "expected bandwidthGuarantee and/or bandwidthLimit (rates such as '150Mbps')")
            return None
        if guarantee is not None and limit is not None and guarantee > limit:
            self.bad(f"{path}.bandwidthGuarantee", f"guarantee {format_rate(guarantee)} is above the limit "
                     f"{format_rate(limit)}; expected guarantee <= limit")
        return Ingress(guarantee_bps=guarantee, limit_bps=limit)

    def destinations(self, obj: Any, path: str) -> tuple[Destination, ...]:
        if obj is None:
            return ()
        if not isinstance(obj, list):
            self.bad(path, "expected a list of {cidrs: [...], bandwidthLimit: ...}")
            return ()
        out: list[Destination] = []
        seen: dict[IPNetwork, int] = {}
        for j, d in enumerate(obj):
            m = self.mapping(d, f"{path}[{j}]")
            if m is None:
                continue
            self.keys(m, _DEST_KEYS, f"{path}[{j}]")
            cidrs: list[IPNetwork] = []
            raw = self.str_list(m.get("cidrs"), f"{path}[{j}].cidrs")
            if not raw:
                self.bad(f"{path}[{j}].cidrs", "required; expected a non-empty list of destination prefixes")
            for k, c in enumerate(raw):
                try:
                    net = ipaddress.ip_network(c, strict=True)
                except ValueError as e:
                    self.bad(f"{path}[{j}].cidrs[{k}]", f"expected an IPv4 or IPv6 prefix such as 10.244.0.0/16: {e}")
                    continue
                if net in seen:
                    self.bad(f"{path}[{j}].cidrs[{k}]", f"{net} is already scoped by {path}[{seen[net]}]")
                    continue
                seen[net] = j
                cidrs.append(net)
            limit = self.rate(m.get("bandwidthLimit"), f"{path}[{j}].bandwidthLimit", required=True)
            if cidrs and limit is not None:
                out.append(Destination(cidrs=tuple(cidrs), limit_bps=limit))
        return tuple(out)

    def rdma(self, obj: Any, path: str) -> Rdma:
        m = self.mapping(obj, path)
        if m is None:
            return Rdma()
        self.keys(m, _RDMA_KEYS, path)
        devices: list[RdmaDeviceRef] = []
        for j, d in enumerate(self.str_list(m.get("devices"), f"{path}.devices")):
            if _PCI_RE.match(d):
                devices.append(RdmaDeviceRef(pci=d.lower()))
            elif (dm := _RDMA_DEV_RE.match(d)) and (dm["port"] is None or 1 <= int(dm["port"]) <= 255):
                devices.append(RdmaDeviceRef(name=dm["name"], port=int(dm["port"]) if dm["port"] else None))
            else:
                self.bad(f"{path}.devices[{j}]", f"expected an HCA[:port] such as 'mlx5_0:1' or a PCI address "
                         f"such as '0000:3b:00.2', got {d!r}")
        sl = m.get("serviceLevel")
        if sl is not None and (isinstance(sl, bool) or not isinstance(sl, int) or not 0 <= sl <= 14):
            self.bad(f"{path}.serviceLevel", f"expected an InfiniBand service level 0-14 (15 is reserved), got {sl!r}")
            sl = None
        tc = m.get("trafficClass")
        if tc is not None and (isinstance(tc, bool) or not isinstance(tc, int) or not 0 <= tc <= 255):
            self.bad(f"{path}.trafficClass", "expected the RoCE IP TOS byte 0-255, DSCP << 2 plus the ECN bits "
                     f"(106 = DSCP 26 with ECT(0)), got {tc!r}")
            tc = None
        nccl_raw = self.mapping(m.get("nccl"), f"{path}.nccl") or {}
        nccl: dict[str, str] = {}
        for k, v in nccl_raw.items():
            if not isinstance(k, str) or not _NCCL_KEY_RE.match(k):
                self.bad(f"{path}.nccl.{k}", "expected an NCCL environment variable name (NCCL_...)")
            elif k in _NCCL_DERIVED:
                self.bad(f"{path}.nccl.{k}", "set by shaperd from rdma.devices, serviceLevel and trafficClass; "
                         "set those instead")
            elif not isinstance(v, str):
                self.bad(f"{path}.nccl.{k}", f"expected a string value (quote numbers: \"{v}\"), got {type(v).__name__}")
            else:
                nccl[k] = v
        return Rdma(devices=tuple(devices), service_level=sl, traffic_class=tc, nccl=nccl)

    def match(self, obj: Any, path: str) -> Match:
        m = self.mapping(obj, path)
        if m is None:
            return Match()
        self.keys(m, _MATCH_KEYS, path)
        cidrs: list[IPNetwork] = []
        for j, c in enumerate(self.str_list(m.get("cidrs"), f"{path}.cidrs")):
            try:
                cidrs.append(ipaddress.ip_network(c, strict=True))
            except ValueError as e:
                self.bad(f"{path}.cidrs[{j}]", f"expected an IPv4 or IPv6 prefix such as 198.18.0.0/24: {e}")
        ifaces = self.str_list(m.get("interfaces"), f"{path}.interfaces")
        for j, name in enumerate(ifaces):
            if not _IFNAME_GLOB_RE.match(name):
                self.bad(f"{path}.interfaces[{j}]", f"{name!r} is not an interface name or glob (max 15 characters)")
        labels = m.get("podLabels")
        if labels is not None and (
            not isinstance(labels, dict)
            or not labels
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
        ):
            self.bad(f"{path}.podLabels", "expected a non-empty mapping of label name to string value")
            labels = None
        return Match(
            cidrs=tuple(cidrs),
            interfaces=tuple(ifaces),
            pod_labels=dict(labels) if labels is not None else None,
            namespaces=tuple(self.str_list(m.get("namespaces"), f"{path}.namespaces")),
            cgroups=tuple(self.str_list(m.get("cgroups"), f"{path}.cgroups")),
            volcano_queues=tuple(self.str_list(m.get("volcanoQueues"), f"{path}.volcanoQueues")),
        )

    def cross_checks(self, node: Node, tenants: list[tuple[int, Tenant]]) -> None:
        # The same prefix in two tenants cannot be classified; nested prefixes
        # can (the most specific wins, see the README).
        owner: dict[IPNetwork, str] = {}
        for i, t in tenants:
            for c in t.match.cidrs:
                if c in owner and owner[c] != t.name:
                    self.bad(f"tenants[{i}].match.cidrs", f"{c} is also claimed by tenant {owner[c]!r}")
                owner.setdefault(c, t.name)
        # An RDMA device (or port, or PCI function) dedicated to two tenants isolates neither.
        claims: list[tuple[RdmaDeviceRef, str]] = []
        for i, t in tenants:
            for j, d in enumerate(t.rdma.devices):
                other = next((owner for c, owner in claims if owner != t.name and _overlaps(c, d)), None)
                if other is not None:
                    self.bad(f"tenants[{i}].rdma.devices[{j}]", f"{d} is also dedicated to tenant {other!r}")
                claims.append((d, t.name))
        cap = node.capacity_bps
        if cap is None:
            return  # checked per device by the planner, once the link speed is known
        if node.reserve_bps is not None and node.reserve_bps >= cap:
            self.bad("node.reserve", f"reserve {format_rate(node.reserve_bps)} leaves nothing of node.capacity {format_rate(cap)}")
        for i, t in tenants:
            if t.limit_bps is not None and t.limit_bps > cap:
                self.bad(
                    f"tenants[{i}].bandwidthLimit",
                    f"limit {format_rate(t.limit_bps)} is above node.capacity {format_rate(cap)}",
                )
        check_guarantee_sum(cap, node.reserve_bps, [t for _, t in tenants], self.bad, where="node.capacity")
        for i, t in tenants:
            if t.ingress is not None and t.ingress.limit_bps is not None and t.ingress.limit_bps > cap:
                self.bad(f"tenants[{i}].ingress.bandwidthLimit",
                         f"limit {format_rate(t.ingress.limit_bps)} is above node.capacity {format_rate(cap)}")
        check_ingress_sum(cap, node.reserve_bps, [t for _, t in tenants], self.bad, where="node.capacity")


def _contiguous(mask: int) -> bool:
    low = mask & -mask
    return ((mask + low) & mask) == 0


def _overlaps(a: RdmaDeviceRef, b: RdmaDeviceRef) -> bool:
    """Whether two rdma.devices entries name the same function or port (a whole device covers its ports)."""
    if a.pci or b.pci:
        return a.pci == b.pci
    return a.name == b.name and (a.port is None or b.port is None or a.port == b.port)
