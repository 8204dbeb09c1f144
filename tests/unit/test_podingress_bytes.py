"""The pod ingress cap on the wire: shaperd's tbf request against tc's bytes, and the kernel's dumps decoded.

Fixtures in tests/unit/fixtures/podingress/, recorded by its record.py (the command is in its docstring; the
kernel and tc in its README) in a throwaway namespace:
- replace_{50m,1500k,40g}.strace: ``tc qdisc replace dev p0 root handle 7368: tbf rate R burst B limit L``
  with R, B, L as shaperd's plan sizes 50M, 1.5M and 40G (40G: a rate above 2^32 bytes/s, TCA_TBF_RATE64);
- del.strace: ``tc qdisc del dev p0 root handle 7368:``;
- show_p0.strace: the qdisc dump after 20 datagrams of 1000 bytes went through the 50M tbf;
- show_w0.strace, filters_w0.strace: the CNI bandwidth plugin's layout on a pod veth (tbf 1: at the root,
  an ingress qdisc whose u32 filter redirects to the IFB bwp0123456789ab).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from shaperd.backends.podingress import diff as pdiff
from shaperd.backends.podingress import kernel_tc
from shaperd.backends.podingress.backend import PodIngressBackend
from shaperd.backends.podingress.objects import ROOT_HANDLE, PodIngress
from shaperd.backends.podingress.ops import DeletePodTbf, SetPodTbf
from shaperd.backends.podingress.plan import PodIngressPlan, tbf_for
from shaperd.core.inventory import Inventory, Link
from shaperd.kernel import nlmsg, rtnl_rows, tc

from ..strace_dump import received, sent

FIX = Path(__file__).parent / "fixtures" / "podingress"
RTM_NEWQDISC, RTM_DELQDISC, RTM_NEWTFILTER = 36, 37, 44


def _text(name: str) -> str:
    return (FIX / f"{name}.strace").read_text()


def _request(name: str, mtype: int) -> bytes:
    (theirs,) = [b for b in sent(_text(name)) if nlmsg.HDR.unpack_from(b)[1] == mtype]
    return theirs


def _pod(ifindex: int, cap_bps: int) -> PodIngress:
    return PodIngress(ifindex, "p0", "uid", "team-a", "web-0", "tenant-a", cap_bps, tbf_for(cap_bps))


@pytest.mark.parametrize("name, cap_bps", [("replace_50m", 50_000_000), ("replace_1500k", 1_500_000),
                                           ("replace_40g", 40_000_000_000)])
def test_the_tbf_request_is_byte_for_byte_what_tc_sends(name, cap_bps):
    theirs = _request(name, RTM_NEWQDISC)
    ifindex = struct.unpack_from("=i", theirs, 20)[0]
    op = SetPodTbf(device="p0", ifindex=ifindex, pod=_pod(ifindex, cap_bps))
    ours = tc._encoder(tc.build_message(op, codec=kernel_tc.CODEC))(7)
    # tc replace says NLM_F_CREATE|NLM_F_REPLACE, as shaperd does: seq and pid aside, equal.
    assert nlmsg.HDR.unpack_from(ours)[:3] == nlmsg.HDR.unpack_from(theirs)[:3]
    assert ours[16:] == theirs[16:]


def test_the_rate_above_2_32_bytes_travels_in_rate64_and_the_table_is_tcs():
    theirs = _request("replace_40g", RTM_NEWQDISC)
    opts = nlmsg.attrs(theirs, nlmsg.HDR.size + rtnl_rows.TCMSG.size, len(theirs))[rtnl_rows.TCA_OPTIONS]
    o = nlmsg.attrs(theirs, *opts)
    assert nlmsg.u64(theirs, o[rtnl_rows.TCA_TBF_RATE64]) == 5_000_000_000
    assert struct.unpack_from("=I", theirs, o[rtnl_rows.TCA_TBF_PARMS][0] + 8)[0] == 0xFFFFFFFF  # the u32 saturated
    # At 1.5M the table is not zeros: tc's truncations, each of them, are what kernel_tc.xmittime does.
    small = _request("replace_1500k", RTM_NEWQDISC)
    o = nlmsg.attrs(small, *nlmsg.attrs(small, nlmsg.HDR.size + rtnl_rows.TCMSG.size, len(small))[rtnl_rows.TCA_OPTIONS])
    s, e = o[2]  # TCA_TBF_RTAB
    assert bytes(small[s:e]) == kernel_tc.rtab(187_500, 3) and struct.unpack_from("=I", small, s)[0] == 656  # 8 B: 42 us, 656 ticks


def test_delete_is_byte_for_byte_what_tc_sends():
    theirs = _request("del", RTM_DELQDISC)
    ifindex = struct.unpack_from("=i", theirs, 20)[0]
    ours = tc._encoder(tc.build_message(DeletePodTbf(device="p0", ifindex=ifindex), codec=kernel_tc.CODEC))(7)
    assert nlmsg.HDR.unpack_from(ours)[:3] == nlmsg.HDR.unpack_from(theirs)[:3] and ours[16:] == theirs[16:]


def _dump(name: str, mtype: int, decode) -> list:
    return [decode(buf, m) for buf in received(_text(name)) for m in nlmsg.messages(buf) if m.type == mtype]


def test_the_dump_of_shaperds_tbf_decodes_to_its_parameters_and_counters():
    (row,) = [q for q in _dump("show_p0", RTM_NEWQDISC, rtnl_rows.qdisc) if q.kind == "tbf"]
    assert (row.handle, row.parent) == (ROOT_HANDLE, rtnl_rows.TC_H_ROOT)
    # The kernel keeps the bucket as the time 65536 bytes take at 6.25 MB/s: 10.48576 ms = 163840 ticks
    # (tc sent 163828: it truncates to whole microseconds; the kernel took TCA_TBF_BURST instead).
    assert row.tbf == rtnl_rows.TbfParams(rate_Bps=6_250_000, peakrate_Bps=0, limit_bytes=221_786,
                                          buffer_ticks=163_840, mtu_ticks=0, linklayer=1)
    c = row.counters
    assert c.packets >= 20 and c.bytes >= 20 * (1000 + 42) and (c.drops, c.backlog_bytes, c.qlen) == (0, 0, 0)
    # What the kernel holds after shaperd's request is in sync with the plan: a second reconcile writes nothing.
    assert pdiff.in_sync(tbf_for(50_000_000), row.tbf)
    assert not pdiff.in_sync(tbf_for(60_000_000), row.tbf)


def test_the_cni_plugins_layout_decodes_to_a_foreign_root_and_an_ingress_redirect():
    rows = _dump("show_w0", RTM_NEWQDISC, rtnl_rows.qdisc)
    (root,) = [q for q in rows if q.kind == "tbf"]
    (ing,) = [q for q in rows if q.kind == "ingress"]
    assert root.handle == 0x10000 and root.tbf.rate_Bps == 6_250_000 and root.tbf.limit_bytes > 512 * 2**20
    assert (ing.ifindex, ing.handle, ing.parent) == (root.ifindex, 0xFFFF0000, 0xFFFFFFF1)
    (f,) = [f for f in _dump("filters_w0", RTM_NEWTFILTER, rtnl_rows.tc_filter) if f is not None]
    assert (f.kind, f.parent, f.mirred) == ("u32", 0xFFFF0000, (1, f.ifindex + 1))  # egress redirect to bwp0123456789ab


class Reads:
    """The reconcile's reads, served from the recorded w0 dumps."""

    def __init__(self):
        self.asked = []

    def all_qdiscs(self):
        return _dump("show_w0", RTM_NEWQDISC, rtnl_rows.qdisc)

    def filters(self, ifindex, parent, device):
        self.asked.append((ifindex, parent, device))
        return [f for f in _dump("filters_w0", RTM_NEWTFILTER, rtnl_rows.tc_filter) if f is not None]


def test_observe_names_the_ifb_and_the_diff_leaves_the_plugins_interface_alone():
    rows = _dump("show_w0", RTM_NEWQDISC, rtnl_rows.qdisc)
    w0 = next(q.ifindex for q in rows if q.kind == "tbf")
    inv = Inventory(links=(Link("w0", w0, kind="veth"), Link("bwp0123456789ab", w0 + 1, kind="ifb")))
    b = PodIngressBackend(None)
    b.snapshot, b.planned = PodIngressPlan(pods=(PodIngress(w0, "w0", "u", "team-a", "web-0", None, 50_000_000,
                                                            tbf_for(50_000_000)),)), True
    reads = Reads()
    observed = b.observe(reads, inv)
    assert reads.asked == [(w0, 0xFFFF0000, "w0")]  # only the planned interface's ingress filters are read
    assert observed.ingress[w0].ifbs == ("bwp0123456789ab",)
    (td,) = b.diff(b.snapshot, observed)
    assert td.ops == [] and td.blocked.startswith("pod team-a/web-0: root qdisc tbf 1: is not shaperd's; left alone")
    assert "redirecting to bwp0123456789ab" in td.note


def test_the_request_is_right_after_another_backends_tcmsg_was_encoded_first():
    """pyroute2 marks a class's attribute table compiled on the class: a tbf message class derived from an
    already compiled tcmsg would encode tcmsg's table (pyroute2's tbf). In a fresh process, an htb request
    first (as in the agent, where the htb backend writes before this one), then ours."""
    import subprocess
    import sys

    code = (
        "from shaperd.kernel import tc\n"
        "from shaperd.backends.htb.kernel_tc import CODEC as HTB\n"
        "from shaperd.backends.htb.ops import CreateRoot\n"
        "from shaperd.backends.common.objects import HtbRoot\n"
        "tc._encoder(tc.build_message(CreateRoot(device='x', ifindex=2, root=HtbRoot()), codec=HTB))(1)\n"
        "from shaperd.backends.podingress import kernel_tc\n"
        "from shaperd.backends.podingress.objects import PodIngress\n"
        "from shaperd.backends.podingress.ops import SetPodTbf\n"
        "from shaperd.backends.podingress.plan import tbf_for\n"
        "p = PodIngress(2, 'p0', 'u', 'a', 'b', None, 50_000_000, tbf_for(50_000_000))\n"
        "print(tc._encoder(tc.build_message(SetPodTbf(device='p0', ifindex=2, pod=p), codec=kernel_tc.CODEC))(7).hex())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout.strip()
    theirs = _request("replace_50m", RTM_NEWQDISC)
    ours = bytes.fromhex(out)
    assert ours[20:24] == struct.pack("=i", 2) and ours[24:] == theirs[24:] and ours[4:16] != b""
