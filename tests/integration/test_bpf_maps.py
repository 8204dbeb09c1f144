"""kernel/bpf_maps against the running kernel: maps, batches, ids, info, TEST_RUN (root, no traffic)."""

import os
import socket
import struct

import pytest

from shaperd.kernel import bpf, bpf_maps
from shaperd.kernel.bpf_maps import MAP_ARRAY, MAP_HASH, MAP_LPM_TRIE, MAP_PERCPU_ARRAY, MAP_PERCPU_HASH

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (bpf)")

U32 = struct.Struct("=I")


def test_hash_map_update_lookup_delete_walk():
    with bpf_maps.create_map(MAP_HASH, 4, 4, 16, "shpd_t_hash") as m:
        assert m.id > 0
        for i in range(1, 4):
            m.update(U32.pack(i), U32.pack(i * 10))
        assert m.lookup(U32.pack(2)) == U32.pack(20)
        assert m.lookup(U32.pack(9)) is None
        assert sorted(m.items().items()) == [(U32.pack(i), U32.pack(i * 10)) for i in range(1, 4)]
        assert m.delete(U32.pack(2)) is True and m.delete(U32.pack(2)) is False
        assert sorted(m.keys()) == [U32.pack(1), U32.pack(3)]
        with pytest.raises(bpf_maps.BpfMapError, match="update key .* in hash map shpd_t_hash") as e:
            m.update(U32.pack(1), U32.pack(0), bpf_maps.BPF_NOEXIST)
        assert e.value.errno == 17  # EEXIST


def test_hash_batch_is_one_syscall_and_lpm_falls_back_per_element():
    with bpf_maps.create_map(MAP_HASH, 4, 4, 1024, "shpd_t_batch") as m:
        entries = {U32.pack(i): U32.pack(i) for i in range(500)}
        assert m.update_batch(entries) == 1
        assert m.items() == entries
        assert m.delete_batch([U32.pack(i) for i in range(250)]) == 1
        assert len(m.keys()) == 250
    with bpf_maps.create_map(MAP_LPM_TRIE, 8, 4, 64, "shpd_t_lpm") as t:
        e = {bpf_maps.lpm_key(24, bytes([198, 18, i, 0])): U32.pack(i) for i in range(5)}
        # 6.18 has generic batch ops on LPM tries too; older kernels answer ENOTSUPP
        assert t.update_batch(e) in (1, 5)
        assert t.items() == e
        t._batch_ok = False  # force the per-element fallback: one syscall per entry
        e2 = {bpf_maps.lpm_key(32, bytes([198, 18, 9, i])): U32.pack(i) for i in range(3)}
        assert t.update_batch(e2) == 3
        assert t.items() == {**e, **e2}
        assert t.delete_batch(list(e)[:2]) == 2 and len(t.keys()) == 6


def test_lpm_trie_longest_prefix_wins_on_lookup():
    with bpf_maps.create_map(MAP_LPM_TRIE, 8, 4, 16, "shpd_t_lpm4") as t:
        t.update(bpf_maps.lpm_key(16, socket.inet_aton("198.18.0.0")), U32.pack(16))
        t.update(bpf_maps.lpm_key(24, socket.inet_aton("198.18.1.0")), U32.pack(24))
        assert t.lookup(bpf_maps.lpm_key(32, socket.inet_aton("198.18.1.7"))) == U32.pack(24)
        assert t.lookup(bpf_maps.lpm_key(32, socket.inet_aton("198.18.2.7"))) == U32.pack(16)
        assert t.lookup(bpf_maps.lpm_key(32, socket.inet_aton("198.19.0.1"))) is None


def test_array_and_percpu_maps():
    with bpf_maps.create_map(MAP_ARRAY, 4, 8, 4, "shpd_t_arr") as a:
        a.update(U32.pack(3), struct.pack("=Q", 42))
        assert a.lookup(U32.pack(3)) == struct.pack("=Q", 42) and a.lookup(U32.pack(0)) == bytes(8)
        assert a.update_batch({U32.pack(i): struct.pack("=Q", i) for i in range(4)}) == 1
        assert a.lookup(U32.pack(2)) == struct.pack("=Q", 2)
    for kind in (MAP_PERCPU_ARRAY, MAP_PERCPU_HASH):
        with bpf_maps.create_map(kind, 4, 4, 4, "shpd_t_pcpu") as p:
            p.update(U32.pack(1), p.percpu_value(U32.pack(5)))
            v = p.lookup(U32.pack(1))
            assert len(v) == 8 * bpf_maps.possible_cpus() and v[:4] == U32.pack(5)


def _priority_from_map(map_fd: int) -> bytes:
    """skb->priority = array[0] if non-zero; return TC_ACT_UNSPEC."""
    i = bpf._insn
    return b"".join([
        bpf.mov64_reg(6, 1),
        i(0x62, 10, 0, -4, 0),  # *(u32 *)(fp - 4) = 0
        bpf.mov64_reg(2, 10), i(0x07, 2, 0, 0, -4),  # r2 = fp - 4
        bpf_maps.ld_map_fd(1, map_fd),
        bpf.call(1),  # bpf_map_lookup_elem
        i(0x15, 0, 0, 4, 0),  # if r0 == 0 goto out
        bpf.ldx_w(2, 0, 0),
        i(0x15, 2, 0, 2, 0),  # if r2 == 0 goto out
        bpf.stx_w(6, 2, 32),  # skb->priority = r2
        i(0x05, 0, 0, 0, 0),  # (goto +0: keeps the branch layout obvious)
        bpf.mov32_imm(0, bpf.TC_ACT_UNSPEC),
        bpf.exit_(),
    ])


ETH_IPV4 = b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + bytes(50)


def test_prog_info_map_ids_adopt_by_id_and_test_run_ctx_out():
    with bpf_maps.create_map(MAP_ARRAY, 4, 4, 1, "shpd_t_prio") as m:
        fd = bpf.load_sched_cls(_priority_from_map(m.fd), "shpd_t_prio")
        try:
            info = bpf_maps.prog_info(fd)
            assert info.name == "shpd_t_prio" and info.map_ids == (m.id,) and info.type == 3
            # a restarted agent: program id -> fd -> info -> map ids -> the same map
            fd2 = bpf_maps.prog_fd_by_id(info.id)
            try:
                (mid,) = bpf_maps.prog_info(fd2).map_ids
            finally:
                os.close(fd2)
            with bpf_maps.open_map_by_id(mid) as adopted:
                assert (adopted.name, adopted.key_size, adopted.value_size) == ("shpd_t_prio", 4, 4)
                adopted.update(U32.pack(0), U32.pack(0x73680010))
            ctx = bpf_maps.SkBuff(priority=6)
            res = bpf_maps.test_run(fd, ETH_IPV4, ctx)
            assert res.retval == bpf.TC_ACT_UNSPEC and res.ctx_out.priority == 0x73680010
            m.update(U32.pack(0), U32.pack(0))
            res = bpf_maps.test_run(fd, ETH_IPV4, ctx)
            assert res.ctx_out.priority == 6  # untouched when the map says nothing
        finally:
            os.close(fd)
    with pytest.raises(bpf_maps.BpfMapError, match="open BPF map id"):
        bpf_maps.map_fd_by_id(0x7FFFFFF0)


@pytest.mark.parametrize("kind,key", [(MAP_HASH, lambda i: U32.pack(i)),
                                      (MAP_LPM_TRIE, lambda i: bpf_maps.lpm_key(32, U32.pack(i)))])
def test_items_reads_everything_batched_or_walked_and_both_agree(kind, key):
    with bpf_maps.create_map(kind, len(key(0)), 4, 20000, "shpd_t_items") as m:
        want = {key(i): U32.pack(i * 3) for i in range(9000)}  # more than one 4096-entry chunk
        m.update_batch(want)
        assert m.items() == want
        assert m._items_walk() == want
        m._lookup_batch_ok = False  # the fallback path alone
        assert m.items() == want
    with bpf_maps.create_map(kind, len(key(0)), 4, 4, "shpd_t_empty") as e:
        assert e.items() == {}


@pytest.mark.parametrize("batched", [True, False])
def test_items_raw_gives_every_entry_as_two_buffers_in_the_same_order_as_items(batched):
    with bpf_maps.create_map(MAP_ARRAY, 4, 4, 70000, "shpd_t_raw") as m:  # more than one 64 Ki-entry chunk
        m.update_batch({U32.pack(i): U32.pack(i * 7 + 1) for i in range(0, 70000, 13)})
        if not batched:
            m._lookup_batch_ok = False  # the walk fallback
        keys, values = m.items_raw()
        assert len(keys) == len(values) == 70000 * 4
        pairs = {keys[i:i + 4]: values[i:i + 4] for i in range(0, len(keys), 4)}
        assert pairs == m.items() and pairs[U32.pack(13)] == U32.pack(92) and pairs[U32.pack(1)] == U32.pack(0)
