"""HTB offload on the wire: the offloaded root against tc's bytes, the dump decoder, the device probe.

Fixtures (tests/unit/fixtures/htb_offload/, recorded with strace -xx in a fresh namespace on this
machine's kernel, 6.18):
- add_offload.strace: ``tc qdisc add dev o0 root handle 7368: htb default 2 offload`` on a veth; the
  kernel refuses it (EOPNOTSUPP, "hw-tc-offload ethtool feature flag must be on") but the request is
  recorded as sent;
- show_software.strace: ``tc qdisc show dev o0`` with a software HTB root (no device here accepts
  offload, so the flag's dump is built from this one, as sch_htb.c htb_dump puts it: an empty
  TCA_HTB_OFFLOAD after TCA_HTB_DIRECT_QLEN);
- features_veth.strace: shaperd's own ETHTOOL_MSG_FEATURES_GET of that veth (no ethtool binary
  on this machine) and the kernel's reply.
"""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

from shaperd.backends.common.objects import HtbRoot
from shaperd.backends.htb.ops import CreateRoot
from shaperd.backends.htb import offload_probe as probe_mod
from shaperd.core.inventory import Inventory, Link
from shaperd.backends.htb.kernel_tc import CODEC as HTB_CODEC
from shaperd.kernel import devlink, ethtool_features, nlmsg, rtnl_rows, tc
from shaperd.kernel.ethtool_features import Features
from shaperd.core.roots import Roots

from ..strace_dump import received, sent

FIX = Path(__file__).parent / "fixtures" / "htb_offload"
RTM_NEWQDISC = 36
NLM_F_EXCL, NLM_F_REPLACE = 0x200, 0x100


def _text(name: str) -> str:
    return (FIX / name).read_text()


def test_the_offloaded_root_is_byte_for_byte_what_tc_sends():
    (theirs,) = [b for b in sent(_text("add_offload.strace")) if nlmsg.HDR.unpack_from(b)[1] == RTM_NEWQDISC]
    ifindex = struct.unpack_from("=i", theirs, 20)[0]
    ours = tc._encoder(tc.build_message(CreateRoot(device="o0", ifindex=ifindex, root=HtbRoot(offload=True)), codec=HTB_CODEC))(7)
    # tc add says NLM_F_EXCL, shaperd NLM_F_REPLACE (it replaces a default root); seq and pid aside, equal.
    t_len, t_type, t_flags = struct.unpack_from("=IHH", theirs)
    o_len, o_type, o_flags = struct.unpack_from("=IHH", ours)
    assert (o_len, o_type) == (t_len, t_type) and ours[16:] == theirs[16:]
    assert t_flags & ~NLM_F_EXCL == o_flags & ~NLM_F_REPLACE and o_flags & NLM_F_REPLACE
    # the flag is really there: a zero-length TCA_HTB_OFFLOAD (type 9) ends the options
    assert ours.endswith(struct.pack("=HH", 4, rtnl_rows.TCA_HTB_OFFLOAD))
    software = tc._encoder(tc.build_message(CreateRoot(device="o0", ifindex=ifindex, root=HtbRoot()), codec=HTB_CODEC))(7)
    assert len(software) == len(ours) - 4


def test_a_veth_refuses_it_with_eopnotsupp_and_the_kernel_says_why():
    last = received(_text("add_offload.strace"))[-1]
    m = next(nlmsg.messages(last))
    assert m.type == nlmsg.NLMSG_ERROR and nlmsg.error_code(last, m) == errno.EOPNOTSUPP
    assert devlink.ack_message(last, m) == "hw-tc-offload ethtool feature flag must be on"


def _htb_root_reply() -> tuple[bytes, nlmsg.Message]:
    for buf in received(_text("show_software.strace")):
        for m in nlmsg.messages(buf):
            if m.type == RTM_NEWQDISC and rtnl_rows.qdisc(buf, m).kind == "htb":
                return bytes(buf[m.start - nlmsg.HDR.size:m.end]), m
    raise AssertionError("no htb qdisc in the recorded dump")


def _with_offload_flag(msg: bytes) -> bytes:
    """The recorded dump with TCA_HTB_OFFLOAD appended inside TCA_OPTIONS (nest and message lengths fixed)."""
    body_at = nlmsg.HDR.size + rtnl_rows.TCMSG.size
    a = nlmsg.attrs(msg, body_at, len(msg))
    start, end = a[rtnl_rows.TCA_OPTIONS]
    flag = nlmsg.rta(rtnl_rows.TCA_HTB_OFFLOAD, b"")
    out = bytearray(msg[:end] + flag + msg[end:])
    struct.pack_into("=H", out, start - 4, end - start + 4 + len(flag))
    struct.pack_into("=I", out, 0, len(out))
    return bytes(out)


def test_the_dump_decoder_reads_the_offload_flag_of_the_root():
    raw, _m = _htb_root_reply()
    (m,) = list(nlmsg.messages(raw))
    row = rtnl_rows.qdisc(raw, m)
    assert (row.kind, row.handle, row.default_minor, row.offload) == ("htb", 0x73680000, 2, False)
    flagged = _with_offload_flag(raw)
    (m2,) = list(nlmsg.messages(flagged))
    row2 = rtnl_rows.qdisc(flagged, m2)
    assert (row2.kind, row2.handle, row2.default_minor, row2.offload) == ("htb", 0x73680000, 2, True)


def test_the_features_request_and_the_recorded_veth_reply():
    text = _text("features_veth.strace")
    getfamily, features = sent(text)
    replies = received(text)
    fam_buf = replies[0]
    fam = devlink.decode_family_id(fam_buf, next(nlmsg.messages(fam_buf)))
    _len, fam_type, _flags, seq, _pid = nlmsg.HDR.unpack_from(features)
    ifindex = struct.unpack_from("=I", features, nlmsg.HDR.size + 4 + 8)[0]  # genlhdr, nest hdr, attr hdr
    # shaperd's own request (no ethtool binary here to record): what the kernel answered below
    assert fam_type == fam and features == ethtool_features.features_request(fam, seq, ifindex)
    assert getfamily[16:] == devlink.getfamily_request(1, "ethtool")[16:]
    reply = next(b for b in replies[1:] if nlmsg.HDR.unpack_from(b)[1] == fam)
    f = ethtool_features.decode_features(reply, next(nlmsg.messages(reply)))
    assert "tx-scatter-gather" in f.active and "highdma" in f.active  # names decoded, not indices
    assert ethtool_features.HW_TC_OFFLOAD not in f.active and ethtool_features.HW_TC_OFFLOAD not in f.hw
    s = probe_mod.support("o0", "veth", f)
    assert not s.capable and s.why == ("driver veth is not known to offload HTB (known: mlx5_core); "
                                       "hw-tc-offload is off (fixed off by the driver)")


class FakeNl:
    def __init__(self, feats):
        self.feats, self.asked = feats, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def family(self):  # EthtoolNl's, resolved before features() answers; the probe keeps it for its next socket
        return 0x1F

    def features(self, ifindex, device):
        self.asked.append(device)
        f = self.feats[device]
        if isinstance(f, Exception):
            raise f
        return f


def test_the_device_probe_on_a_fixture_sysfs(tmp_path):
    drivers = tmp_path / "bus" / "pci" / "drivers"
    for dev, drv in (("eth0", "mlx5_core"), ("eth1", "mlx5_core"), ("eth2", "ice")):
        (drivers / drv).mkdir(parents=True, exist_ok=True)
        d = tmp_path / "class" / "net" / dev / "device"
        d.mkdir(parents=True)
        os.symlink(drivers / drv, d / "driver")
    on = Features(frozenset({"hw-tc-offload", "tx-scatter-gather"}), frozenset({"hw-tc-offload"}))
    off = Features(frozenset({"tx-scatter-gather"}), frozenset({"hw-tc-offload"}))
    from shaperd.core.errors import KernelError

    nl = FakeNl({"eth0": on, "eth1": off, "eth2": on,
                 "v0": KernelError("read", "ethtool features", "v0", "No such device", errno.ENODEV)})
    p = probe_mod.DeviceProbe(roots=Roots.of(sys=str(tmp_path)), opener=lambda: nl)
    links = (Link("eth0", 2), Link("eth1", 3), Link("eth2", 4), Link("v0", 5, kind="veth"), Link("lo", 1))
    inv = p.annotate(Inventory(links=links), list(links[:4]))
    got = {l.name: l.htb_offload for l in inv.links}
    assert got["eth0"].capable and got["eth0"].why == "mlx5_core, hw-tc-offload on"
    assert not got["eth1"].capable and got["eth1"].why == "hw-tc-offload is off (ethtool -K eth1 hw-tc-offload on)"
    assert not got["eth2"].capable and got["eth2"].why.startswith("driver ice is not known to offload HTB")
    assert not got["v0"].capable and got["v0"].driver == "veth" and "ethtool features unreadable" in got["v0"].why
    assert got["lo"] is None and nl.asked == ["eth0", "eth1", "eth2", "v0"]  # only the uplinks asked


def test_the_default_opener_hands_the_resolved_family_to_the_next_socket(monkeypatch):
    opened = []

    class Nl(FakeNl):
        def __init__(self, netns, run_root, family):
            super().__init__({"eth0": Features(frozenset(), frozenset())})
            opened.append(family)

    monkeypatch.setattr(probe_mod.ethtool_features, "EthtoolNl", Nl)
    p = probe_mod.DeviceProbe()
    p.probe([Link("eth0", 2)])
    p.probe([Link("eth0", 2)])
    assert opened == [None, 0x1F]  # the first socket resolves the family by name, the next one need not
