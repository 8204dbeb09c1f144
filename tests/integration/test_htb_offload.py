"""HTB offload against the real kernel, in fresh namespaces: no device here accepts it (no mlx5, no
netdevsim in this kernel), so what is tested is the refusal and the fallback, and that ``auto`` never
tries where the device probe says no. The accept path runs on a fake kernel side only (unit tests).

- ``node.htbOffload: on`` on a veth: the kernel refuses the offloaded root (EOPNOTSUPP, "hw-tc-offload
  ethtool feature flag must be on"); the next reconcile plans software HTB with a warning naming the
  device and the kernel's message; the tree is complete and a further reconcile writes nothing;
- ``auto`` on a veth: the device probe (real ethtool genetlink) says no, nothing offloaded is sent;
- the device probe against the real ethtool genetlink of a veth.
"""

from __future__ import annotations

import json

from shaperd.backends.htb.ops import CreateRoot
from shaperd.core.config import load_text
from shaperd.backends.htb.offload_probe import DeviceProbe
from shaperd.engine.reconciler import open_node
from shaperd.engine.probe import probe_capabilities
from shaperd.kernel.rtnl import RtnlReader

from .conftest import needs_root

pytestmark = needs_root

CFG = """
node:
  interfaces: [up0]
  capacity: 10Gbps
  htbOffload: {mode}
tenants:
  - {{name: a, bandwidthGuarantee: 4Gbps, priority: 10, match: {{cidrs: [198.18.1.0/24]}}}}
  - {{name: b, bandwidthGuarantee: 3Gbps, priority: 10, match: {{cidrs: [198.18.2.0/24]}}}}
"""
KERNEL_SAYS = "hw-tc-offload ethtool feature flag must be on"


def htb_of(rep):
    (dp,) = rep.plan.desired["htb"].devices
    return dp


def root_qdisc(bed) -> dict:
    (root,) = [q for q in json.loads(bed.exec("tc", "-j", "qdisc", "show", "dev", "up0").stdout)
               if q.get("root")]
    return root


def test_on_a_veth_the_kernel_refuses_offload_and_shaperd_falls_back_to_software_htb(bed):
    caps = probe_capabilities()
    assert caps.bpf_maps, caps.notes  # offload needs the map classifier: without it nothing would be tried
    rec = open_node(caps, netns=bed.node)
    htb = next(b for b in rec.backends if b.name == "htb")
    cfg = load_text(CFG.format(mode="on"))

    first = rec.apply(cfg)
    # Tried ("on" ignores the device probe), refused by the kernel, and planned again at once in software
    # within the same reconcile (engine/fallback.py): the device is never left without a tree.
    ((key, why),) = htb.offload_refused.items()
    assert key[1] == "up0" and KERNEL_SAYS in why
    assert htb.refused(None) == {"up0": (key[0], why)}
    assert first.ok, [(d.device, d.failed) for d in first.devices if d.failed]
    dp = htb_of(first)
    assert not dp.root.offload and "the kernel refused htb offload on up0: " in dp.offload_why
    assert any("refused htb offload on up0" in w and KERNEL_SAYS in w for w in first.plan.warnings)
    root = root_qdisc(bed)
    assert root["kind"] == "htb" and root["handle"] == "7368:" and "offload" not in json.dumps(root)
    with RtnlReader(bed.node) as reader:  # iproute2 6.1 prints htb classes without JSON
        classes = {c.classid for c in reader.htb_classes(dp.ifindex, "up0")}
    assert classes == {c.classid for c in dp.classes}  # complete
    assert htb.offload["up0"][0] is False

    again = rec.apply(cfg)
    assert again.ok and again.changes == 0  # in sync: no write, no retry of the offload
    assert htb.offload_refused == {key: why}


def test_auto_never_tries_offload_on_a_veth(bed):
    caps = probe_capabilities()
    rec = open_node(caps, netns=bed.node)
    rep = rec.apply(load_text(CFG.format(mode="auto")))
    assert rep.ok
    link = rep.inventory.link("up0")
    assert link.htb_offload is not None and not link.htb_offload.capable
    sent = [op for d in rep.devices for op in d.ops]
    assert sent and not any(isinstance(op, CreateRoot) and op.root.offload for op in sent)
    dp = htb_of(rep)
    assert not dp.root.offload and "driver veth is not known to offload HTB" in dp.offload_why
    assert not any("htb offload" in w for w in rep.plan.warnings)  # a NIC that cannot: normal, no warning


def test_the_device_probe_reads_the_real_ethtool_features_of_a_veth(bed):
    rec = open_node(probe_capabilities(), netns=bed.node)
    (link,) = [l for l in rec.inventory().links if l.name == "up0"]
    got = DeviceProbe(bed.node).probe([link])["up0"]
    assert (got.capable, got.driver) == (False, "veth")
    assert got.why == ("driver veth is not known to offload HTB (known: mlx5_core); "
                       "hw-tc-offload is off (fixed off by the driver)")
