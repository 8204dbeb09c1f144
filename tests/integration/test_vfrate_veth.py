"""VF rates against the real kernel, on a veth in a namespace this test creates (no SR-IOV here).

The kernel refuses IFLA_VFINFO_LIST on a device without ndo_set_vf_rate with EOPNOTSUPP: that must
come back as a typed KernelError naming the VF and the device, and cost nothing else (the link is
unchanged, the same writer and reader go on working). The read-back of a veth has no VF info, so the
backend, given a fixture sysfs tree whose PF netdev is that veth, blocks the PF and writes nothing.
"""

from __future__ import annotations

import errno
import os

from shaperd_bed import netns

from shaperd.core import config
from shaperd.backends.vfrate.backend import VfRateBackend
from shaperd.backends.vfrate.ops import SetVfRate
from shaperd.engine.reconciler import Reconciler
from shaperd.core.errors import KernelError
from shaperd.core.inventory import Capabilities
from shaperd.kernel import tc
from shaperd.backends.vfrate import kernel as vf
from shaperd.kernel.rtnl import RtnlReader
from shaperd.core.roots import Roots

from ..rdma_fixture import Node
from .conftest import needs_root

pytestmark = needs_root


def _bed(nets, tag):
    ns = nets.add(f"vfr-{tag}-{os.getpid()}")
    netns.run(["ip", "-n", ns, "link", "add", "vfa", "type", "veth", "peer", "name", "vfb"])
    return ns


def test_the_kernels_refusal_on_a_veth_is_a_typed_error_naming_the_vf_and_device_and_costs_nothing_else():
    with netns.Namespaces(stop_grace_s=0) as nets:
        ns = _bed(nets, "err")
        reader, writer = RtnlReader(ns), tc.open_writer(ns)
        try:
            link = next(l for l in reader.links() if l.name == "vfa")
            op = SetVfRate(device="vfa", ifindex=link.ifindex, vf=0, min_mbps=100, max_mbps=1000, tenant="a")
            res = vf.apply_ops(writer, [op])
            assert res.applied == [] and len(res.failed) == 1
            failed, err = res.failed[0]
            assert failed is op and isinstance(err, KernelError) and err.errno == errno.EOPNOTSUPP
            assert str(err) == "set VF 0 rates min 100 max 1000 Mbit/s on vfa: Operation not supported"
            # Nothing else: the link is as it was, the read-back says "no VF info", both sockets still answer.
            after = next(l for l in reader.links() if l.name == "vfa")
            assert after == link
            st = vf.read_pf(reader, link.ifindex, "vfa")
            assert st is not None and st.name == "vfa" and not st.reported and st.vfs == ()
            assert vf.apply_ops(writer, [op]).failed[0][1].errno == errno.EOPNOTSUPP
            assert vf.read_pf(reader, 999_999, "gone") is None  # ENODEV: the PF is gone, not an error
        finally:
            writer.close()
            reader.close()


def test_the_backend_on_a_veth_pf_reads_it_blocks_it_and_sends_no_write(tmp_path):
    node = Node(tmp_path).build()
    pf_net = node.sys / "devices" / "pci0000:3a" / "0000:3b:00.0" / "net"
    (pf_net / "ens1f0").rmdir()
    (pf_net / "vfa").mkdir()  # the fixture PF's netdev is the veth of this test's namespace
    roots = Roots.of(sys=str(node.sys), proc=str(tmp_path / "proc"), run=str(tmp_path / "run"))
    cfg = config.load_text("""
tenants:
  - {name: a, bandwidthGuarantee: 1Gbps, bandwidthLimit: 2Gbps, priority: 1, rdma: {devices: [mlx5_2]}}
node: {interfaces: [vfb], capacity: 10Gbps}
""")
    with netns.Namespaces(stop_grace_s=0) as nets:
        ns = _bed(nets, "be")
        reader, writer = RtnlReader(ns), tc.open_writer(ns)
        sent = []
        real = writer.nlm_request_batch
        writer.nlm_request_batch = lambda msgs, *a, **kw: (sent.extend(msgs), real(msgs, *a, **kw))[1]
        try:
            backend = VfRateBackend(writer)
            rec = Reconciler(reader, [backend], Capabilities(), roots=roots)
            for _ in range(2):
                rep = rec.apply(cfg)
                (t,) = rep.devices
                assert t.device == "vfa" and "reports no VF info" in t.blocked and t.ops == []
            assert sent == []
            assert [v.vf for v in backend.snapshot.desired.vfs] == [0]
        finally:
            writer.close()
            reader.close()
