"""What is on the node, as plain data: the planners' second input.

Discovery fills these in (links from netlink, speeds from sysfs, probed
kernel capabilities); tests build them by hand. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class HtbOffloadSupport:
    """What the device probe (discovery/htb_offload.py) says about HTB offload on one link."""

    capable: bool
    why: str  # "mlx5_core, hw-tc-offload on" or why not
    driver: str = ""


@dataclass(frozen=True)
class Link:
    name: str
    ifindex: int
    kind: str = ""  # rtnetlink IFLA_INFO_KIND: "veth", "bridge", "" for physical NICs
    speed_bps: int | None = None  # what the kernel reports; None where it reports none
    mtu: int = 1500
    up: bool = True
    tx_queues: int = 1  # IFLA_NUM_TX_QUEUES (the edt backend puts one sch_fq under mq per queue)
    # The HTB offload device probe, for uplinks where node.htbOffload is not off; None = not probed.
    htb_offload: HtbOffloadSupport | None = None


@dataclass(frozen=True)
class Capabilities:
    """What this kernel can do, probed once at start."""

    htb: bool = True
    u32: bool = True
    bpf: bool = False
    # eBPF maps (LPM trie) and direct-action cls_bpf on clsact: the map classifier can run.
    bpf_maps: bool = False
    # How a restarted agent reopens the map classifier's maps: "pins" (bpffs, CAP_BPF), "id"
    # (BPF_*_GET_FD_BY_ID, CAP_SYS_ADMIN), or "" where bpf_maps is False.
    bpf_adopt: str = ""
    # The bpffs the probe pinned under (where bpf_adopt is "pins").
    bpf_pin_root: str = ""
    # Leaf qdisc kinds available, in order of preference among those we use.
    leaf_kinds: frozenset[str] = frozenset({"bfifo"})
    notes: tuple[str, ...] = ()
    # The edt data plane's needs (kernel/probe.py): sch_fq and mq qdiscs.
    fq: bool = False
    mq: bool = False
    # Without a probe namespace: (module, "present" | "absent" | "unknown", evidence) per tc kind, read from the
    # kernel's files (kernel/qdisc_kinds.py). "unknown" sch_fq or mq is offered and verified at apply.
    kinds: tuple[tuple[str, str, str], ...] = ()
    # The bpffs the edt stampers are pinned under (the probe loaded one and got it back there), independent of
    # the map classifier's verdict; "" where the stampers' maps are found by id (CAP_SYS_ADMIN) or not at all.
    edt_pin_root: str = ""
    # Why bpf() is refused, where the probe could tell the cause (kernel/probe.py): "bpf_refused_by_seccomp" (a
    # seccomp filter, e.g. the container runtime's RuntimeDefault profile, refuses it although the process holds
    # CAP_BPF or CAP_SYS_ADMIN); "" where bpf() works or the cause is not known. The node is then degraded.
    bpf_refused: str = ""

    def kind(self, module: str) -> tuple[str, str] | None:
        """(state, evidence) of ``module`` ("sch_fq") where the probe read evidence instead of testing."""
        return next(((s, e) for m, s, e in self.kinds if m == module), None)


@dataclass(frozen=True)
class CgroupRef:
    """A cgroup v2 directory: its id (inode) and depth below the cgroup2 root."""

    path: str
    level: int
    id: int


@dataclass(frozen=True)
class Pod:
    """A pod on this node, as discovery found it (API facts plus resolved kernel handles)."""

    uid: str
    namespace: str
    name: str
    labels: tuple[tuple[str, str], ...] = ()
    ips: tuple[str, ...] = ()
    host_network: bool = False
    # Where its traffic enters the node (routed veth, or bridge port); None if not found (yet).
    host_ifindex: int | None = None
    host_ifname: str | None = None
    # hostNetwork pods: the pod cgroup (cgroup v2).
    cgroup: CgroupRef | None = None
    # RDMA devices (names) the kubelet assigned to it (pod-resources API), resolved to this node's devices.
    rdma_devices: tuple[str, ...] = ()
    # Why something could not be resolved (logged and retried on the next resync).
    problems: tuple[str, ...] = ()
    # Its Volcano queue (PodGroup spec.queue, else queue-name label/annotation), when Volcano is watched.
    volcano_queue: str | None = None
    # The raw values of its bandwidth annotations (core/podcaps.py parses them); None: not annotated.
    egress_bandwidth: str | None = None
    ingress_bandwidth: str | None = None

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Gid:
    """One populated GID table entry of an RDMA port."""

    index: int
    gid: str
    type: str = ""  # "IB/RoCE v1", "RoCE v2" (gid_attrs/types)
    netdev: str | None = None  # gid_attrs/ndevs: the netdev a RoCE GID belongs to


@dataclass(frozen=True)
class RdmaPort:
    device: str
    port: int
    link_layer: str  # "InfiniBand" or "Ethernet" (RoCE)
    state: str = ""  # "ACTIVE", "DOWN", ... (the number prefix dropped)
    phys_state: str = ""  # "LinkUp", "Disabled", ...
    rate: str = ""  # as the kernel says it: "100 Gb/sec (4X EDR)"
    rate_gbps: float | None = None
    lid: int | None = None  # InfiniBand only
    sm_lid: int | None = None
    gids: tuple[Gid, ...] = ()
    netdevs: tuple[str, ...] = ()  # RoCE: the netdevs behind this port's GIDs

    @property
    def ref(self) -> str:
        return f"{self.device}:{self.port}"

    @property
    def roce_v2_gid_index(self) -> int | None:
        """The first RoCE v2 GID with an IPv4-mapped or routable address (what NCCL_IB_GID_INDEX wants)."""
        v2 = [g for g in self.gids if g.type == "RoCE v2"]
        mapped = [g for g in v2 if g.gid.startswith("0000:0000:0000:0000:0000:ffff:")]
        pick = mapped or [g for g in v2 if not g.gid.startswith("fe80:")] or v2
        return pick[0].index if pick else None


@dataclass(frozen=True)
class RdmaDevice:
    """An RDMA device (HCA, or an SR-IOV VF's function) as sysfs and RDMA netlink describe it."""

    name: str
    node_type: str = ""  # "1: CA"
    node_guid: str = ""
    fw_ver: str = ""
    pci: str | None = None  # its PCI function, "0000:3b:00.2"; None for software devices (rxe)
    is_vf: bool = False
    pf_pci: str | None = None  # the PF of a VF (device/physfn)
    sriov_numvfs: int | None = None  # on a PF with SR-IOV
    # A VF's place on its PF (sysfs: the PF's device/virtfnN -> this function; the PF's net/ and driver):
    vf_index: int | None = None  # N of the PF's virtfnN link: `ip link set dev PF vf N` and devlink's vfnum
    pf_netdev: str | None = None  # the PF's netdev, which takes the VF's rates
    pf_driver: str | None = None  # the PF's driver (mlx5_core, ice, i40e, ixgbe): what it refuses differs
    # The PF's devlink handle, <bus>/<device> from the PF's subsystem link ("pci/0000:3b:00.0"); None: unknown.
    pf_devlink: str | None = None
    parent: str | None = None  # software devices (rxe): the netdev they sit on
    ports: tuple[RdmaPort, ...] = ()

    def port(self, n: int) -> RdmaPort | None:
        return next((p for p in self.ports if p.port == n), None)


@dataclass(frozen=True)
class Inventory:
    links: tuple[Link, ...] = ()
    # Devices that carry a default route (IPv4 or IPv6), in route order.
    default_route_devices: tuple[str, ...] = ()
    capabilities: Capabilities = field(default_factory=Capabilities)
    # Kubernetes pods on this node (empty without Kubernetes discovery).
    pods: tuple[Pod, ...] = ()
    # match.cgroups of the tenants file, resolved: path -> CgroupRef (missing ones absent).
    cgroups: tuple[CgroupRef, ...] = ()
    # RDMA devices visible from this namespace, and what could not be read (or seen) and why.
    rdma: tuple[RdmaDevice, ...] = ()
    rdma_notes: tuple[str, ...] = ()

    def rdma_device(self, name: str) -> RdmaDevice | None:
        return next((d for d in self.rdma if d.name == name), None)

    def link(self, name: str) -> Link | None:
        return next((l for l in self.links if l.name == name), None)
