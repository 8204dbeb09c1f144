"""shaperd's DCB encoder (kernel/dcb.py) against iproute2's ``dcb``, byte for byte.

Fixtures: tests/unit/fixtures/dcb/*.strace, recorded by tests/dcb_record.py
(the command is in each ``.cmd``). The sequence number is dcb's (a time
stamp), so the encoder is given the recorded one; every other byte must be
equal. The decoder tests run on hand-built IEEE_GET answers, laid out as
include/uapi/linux/dcbnl.h (6.1) says; their sizes are checked here too.
"""

from __future__ import annotations

import struct
from pathlib import Path

from shaperd.kernel import dcb, nlmsg
from tests.strace_dump import sent

FIX = Path(__file__).parent / "fixtures" / "dcb"
DEV = "dcbva"


def _sets(name: str) -> tuple[bytes, bytes | None]:
    """(the SET message, the GET sent before it, if any)."""
    msgs = sent((FIX / f"{name}.strace").read_text())
    sets = [m for m in msgs if nlmsg.HDR.unpack_from(m)[1] == dcb.RTM_SETDCB]
    gets = [m for m in msgs if nlmsg.HDR.unpack_from(m)[1] == dcb.RTM_GETDCB]
    assert len(sets) == 1, f"{name}: expected one SET, got {len(sets)}"
    return sets[0], (gets[0] if gets else None)


def _seq(msg: bytes) -> int:
    return nlmsg.HDR.unpack_from(msg)[3]


def test_struct_offsets_match_what_the_c_compiler_says():
    """uapi_layout.json: offsetof/sizeof from linux/dcbnl.h, compiled by the recorder (uapi_layout.c)."""
    import json

    c = json.loads((FIX / "uapi_layout.json").read_text())
    assert (c["sizeof.ieee_ets"], c["sizeof.ieee_maxrate"], c["sizeof.ieee_pfc"], c["sizeof.dcb_app"],
            c["sizeof.dcbmsg"]) == (dcb.ETS.size, dcb.MAXRATE.size, dcb.PFC.size, dcb.APP.size, dcb.DCBMSG.size)
    # struct.Struct("=BBB8s8s8s8s..."): three u8, then the 8-byte arrays in declaration order
    assert [c[f"ieee_ets.{f}"] for f in ("tc_tx_bw", "tc_rx_bw", "tc_tsa", "prio_tc", "reco_prio_tc")] == \
        [3, 11, 19, 27, 51]
    # "=BBBxH2x8Q8Q": pfc_cap, pfc_en, mbc, pad, delay, pad to 8, requests[8], indications[8]
    assert [c[f"ieee_pfc.{f}"] for f in ("pfc_en", "mbc", "delay", "requests", "indications")] == [1, 2, 4, 8, 72]
    assert struct.calcsize("=BBBxH2x") == c["ieee_pfc.requests"]
    # "=BBH": selector, priority, protocol
    assert [c[f"dcb_app.{f}"] for f in ("selector", "priority", "protocol")] == [0, 1, 2]


def test_struct_sizes_match_the_uapi():
    assert dcb.ETS.size == 59  # 3 u8 + 7 arrays of 8
    assert dcb.MAXRATE.size == 64
    assert dcb.APP.size == 4
    assert dcb.PFC.size == 136  # u8 x3, pad, u16, pad to 8, 2 x u64[8]
    assert dcb.DCBMSG.size == 4


def test_ets_set_equals_dcb_ets_set():
    got, get = _sets("ets_set")
    ets = dcb.Ets(tc_tx_bw=(10, 60, 30, 0, 0, 0, 0, 0), tc_tsa=(dcb.TSA_ETS,) * 8, prio_tc=tuple(range(8)))
    assert dcb.encode_set(DEV, _seq(got), ets=ets) == got
    assert get is not None and dcb.encode_get(DEV, _seq(get)) == get


def test_maxrate_set_equals_dcb_maxrate_set():
    got, get = _sets("maxrate_set")
    rates = (0, 10_000_000, 2_500_000, 0, 0, 0, 0, 1)  # kbit/s: 10 Gbit/s, 2.5 Gbit/s, 1 kbit/s
    assert dcb.encode_set(DEV, _seq(got), maxrate_kbps=rates) == got
    assert get is not None and dcb.encode_get(DEV, _seq(get)) == get


def test_iproute2_6_1_sends_bytes_per_second_where_the_uapi_wants_kbit():
    """`dcb maxrate set ... 1:10000000kbit` (10 Gbit/s) sends 1.25e9: bytes/s, 125 x the uapi's kbit/s."""
    got, _ = _sets("maxrate_set_kbit")
    ieee = nlmsg.attrs(got, nlmsg.HDR.size + dcb.DCBMSG.size, len(got))[dcb.DCB_ATTR_IEEE]
    span = nlmsg.attrs(got, *ieee)[dcb.DCB_ATTR_IEEE_MAXRATE]
    sent_values = dcb.MAXRATE.unpack_from(got, span[0])
    assert sent_values[1] == 10_000_000 * 125
    assert sent_values[7] == 125
    ours = dcb.encode_set(DEV, _seq(got), maxrate_kbps=(0, 10_000_000, 2_500_000, 0, 0, 0, 0, 1))
    assert ours != got and ours == _sets("maxrate_set")[0][:8] + got[8:12] + _sets("maxrate_set")[0][12:]


def test_app_add_equals_dcb_app_add():
    got, _ = _sets("app_add")
    apps = [dcb.App(dcb.SEL_DSCP, 26, 1), dcb.App(dcb.SEL_DSCP, 24, 2), dcb.App(dcb.SEL_DSCP, 18, 3)]
    assert dcb.encode_set(DEV, _seq(got), apps=apps) == got


def test_app_delete_is_the_same_table_under_ieee_del():
    apps = [dcb.App(dcb.SEL_DSCP, 26, 1)]
    add, delete = dcb.encode_set(DEV, 7, apps=apps), dcb.encode_del_apps(DEV, 7, apps)
    assert delete[nlmsg.HDR.size + 1] == dcb.DCB_CMD_IEEE_DEL
    cmd_at = nlmsg.HDR.size + 1
    assert add[:cmd_at] == delete[:cmd_at] and add[cmd_at + 1:] == delete[cmd_at + 1:]


# -- decoding hand-built answers (not recorded: no device here answers an IEEE_GET) ------------
def hand_built_get_answer(ifname: str, *, ets: dcb.Ets | None, maxrate=None, apps=(), pfc: bytes | None = None,
                          dcbx: int | None = 8) -> bytes:
    """An IEEE_GET answer laid out as dcbnl_ieee_fill() builds it: IFNAME, IEEE {ETS, MAXRATE, PFC, APP_TABLE}, DCBX."""
    ieee = b""
    if ets is not None:
        ieee += nlmsg.rta(dcb.DCB_ATTR_IEEE_ETS, ets.pack())
    if maxrate is not None:
        ieee += nlmsg.rta(dcb.DCB_ATTR_IEEE_MAXRATE, dcb.MAXRATE.pack(*maxrate))
    if pfc is not None:
        ieee += nlmsg.rta(dcb.DCB_ATTR_IEEE_PFC, pfc)
    ieee += dcb.app_table(apps)
    body = dcb.DCBMSG.pack(0, dcb.DCB_CMD_IEEE_GET, 0) + nlmsg.rta(dcb.DCB_ATTR_IFNAME, ifname.encode() + b"\0")
    body += nlmsg.rta(dcb.DCB_ATTR_IEEE | dcb.NLA_F_NESTED, ieee)
    if dcbx is not None:
        body += nlmsg.rta(dcb.DCB_ATTR_DCBX, bytes([dcbx]))
    return nlmsg.header(16 + len(body), dcb.RTM_GETDCB, 0, 5) + body


def _decode(buf: bytes) -> dcb.DcbState:
    return dcb.decode_ieee(buf, next(nlmsg.messages(buf)))


def test_decode_a_full_answer():
    ets = dcb.Ets(tc_tx_bw=(10, 60, 30, 0, 0, 0, 0, 0), tc_tsa=(2,) * 8, prio_tc=(0, 1, 2, 0, 0, 0, 0, 0), ets_cap=8)
    pfc = dcb.PFC.pack(8, 0b1000, 0, 0x1234, *([0] * 16))
    buf = hand_built_get_answer("ens1f0", ets=ets, maxrate=(0, 5, 0, 0, 0, 0, 0, 7),
                                apps=[dcb.App(5, 26, 3), dcb.App(1, 0x8915, 3)], pfc=pfc)
    st = _decode(buf)
    assert st.ifname == "ens1f0" and st.ets == ets and st.maxrate_kbps == (0, 5, 0, 0, 0, 0, 0, 7)
    assert st.apps == (dcb.App(5, 26, 3), dcb.App(1, 0x8915, 3))
    assert st.pfc == dcb.Pfc(8, 0b1000, 0, 0x1234) and st.pfc.priorities == (3,)
    assert st.dcbx == 8


def test_decode_an_answer_of_a_driver_without_ets_or_maxrate_ops():
    st = _decode(hand_built_get_answer("eth0", ets=None, dcbx=None))
    assert st.ets is None and st.maxrate_kbps is None and st.pfc is None and st.apps == () and st.dcbx is None


def test_set_status_reads_the_drivers_errno():
    body = dcb.DCBMSG.pack(0, dcb.DCB_CMD_IEEE_SET, 0) + nlmsg.rta(dcb.DCB_ATTR_IEEE, bytes([256 - 22]))
    buf = nlmsg.header(16 + len(body), dcb.RTM_SETDCB, 0, 1) + body
    assert dcb.set_status(buf, next(nlmsg.messages(buf))) == 22
    ok = nlmsg.header(16 + len(body), dcb.RTM_SETDCB, 0, 1) + body[:-8] + nlmsg.rta(dcb.DCB_ATTR_IEEE, b"\0")
    assert dcb.set_status(ok, next(nlmsg.messages(ok))) == 0


def test_encoder_pads_odd_interface_names_like_libmnl():
    msg = dcb.encode_get("a", 1)
    assert len(msg) == 16 + 4 + 8 and struct.unpack_from("=H", msg, 20)[0] == 6
