"""The eBPF map classifier adopted through bpffs pins (a private bpffs mount per test, never the
host's /sys/fs/bpf): a restarted agent adopts through the pins with no bpf() or netlink write (the
by-id commands refused outright), the pins are the attached program's, a pin of another program or a
foreign map is replaced and re-pinned, pins of a vanished device and a crash's temporary entry are
collected, teardown removes them all."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shaperd.backends.common import mapcls
from shaperd.core.config import load_file as load_config
from shaperd.engine.reconciler import open_node
from shaperd.backends.common import kernel_classifier as bpf_classify
from shaperd.kernel import bpf_maps
from shaperd.kernel import bpf_pins
from shaperd.engine.probe import probe_capabilities

from .conftest import needs_root
from .test_map_classifier import CFG, Counting, class_packets, B

pytestmark = needs_root
_OBJ_PIN, _OBJ_GET = 6, 7


@pytest.fixture
def cfg_file(tmp_path) -> Path:
    p = tmp_path / "tenants.yaml"
    p.write_text(CFG)
    return p


def attached_prog_id(bed, dev: str = "up0") -> int:
    out = json.loads(bed.exec("tc", "-j", "filter", "show", "dev", dev, "egress").stdout or "[]")
    (pid,) = [f["options"]["prog"]["id"] for f in out
              if f.get("options", {}).get("bpf_name", "").startswith("shpd_c") and "prog" in f["options"]]
    return pid


def pinned(store: bpf_pins.PinStore, dev: str) -> tuple[int, set[int], set[int]]:
    """(pinned program id, that program's map ids, the pinned maps' ids)."""
    fds = store.get(dev)
    try:
        info = bpf_maps.prog_info(fds["prog"])
        return info.id, set(info.map_ids), {bpf_maps.map_info(fd).id for n, fd in fds.items() if n != "prog"}
    finally:
        for fd in fds.values():
            os.close(fd)


def refuse_by_id(monkeypatch):
    """Adoption by id is what needs CAP_SYS_ADMIN: make any use of it fail the test."""
    def refuse(*a, **kw):
        raise AssertionError("adopted by id, not through the pins")

    monkeypatch.setattr(bpf_maps, "prog_fd_by_id", refuse)
    monkeypatch.setattr(bpf_maps, "map_fd_by_id", refuse)


def test_restart_adopts_through_pins_with_no_write(bed, cfg_file, pinfs, monkeypatch):
    caps = probe_capabilities(bpffs_root=str(pinfs))
    assert caps.bpf_maps and caps.bpf_adopt == "pins" and caps.bpf_pin_root == str(pinfs), caps.notes
    first = open_node(caps, netns=bed.node)
    rep = first.apply(load_config(cfg_file))
    assert rep.ok and rep.changes > 0
    store = bpf_pins.PinStore(pinfs, bpf_pins.scope_for(bed.node)).sub("htb")
    assert store.entries() == ["up0"]
    assert sorted(p.name for p in store.path("up0").iterdir()) == sorted(
        ["prog"] + [f"map_{r}" for r in mapcls.ROLES])
    prog_id, prog_maps, pin_maps = pinned(store, "up0")
    assert prog_id == attached_prog_id(bed) and pin_maps == prog_maps and len(pin_maps) == len(mapcls.ROLES)

    # A restarted agent (fresh sockets, no state) that cannot read anything by id.
    refuse_by_id(monkeypatch)
    again = open_node(caps, netns=bed.node)
    htb = next(b for b in again.backends if b.name == "htb")
    count = Counting(monkeypatch, htb.writer)
    rep = again.apply(load_config(cfg_file))
    assert rep.ok and rep.changes == 0, [t.ops for b in rep.backends for t in b.targets]
    assert count.writes() == [] and count.netlink == 0
    assert _OBJ_PIN not in count.bpf and _OBJ_GET in count.bpf  # read through the pins, none written
    assert attached_prog_id(bed) == prog_id  # adopted, not recreated

    # One more pod IP through the pinned maps: one bpf() write, no netlink, no pin.
    count.reset()
    cfg_file.write_text(CFG.replace("198.18.2.1/32]", "198.18.2.1/32, 198.18.3.1/32]"))
    rep = again.apply(load_config(cfg_file))
    assert rep.ok and rep.changes == 1
    assert count.writes() == ["update_batch"] and count.netlink == 0 and _OBJ_PIN not in count.bpf
    before = class_packets(bed)
    bed.send("198.18.3.1", "198.18.0.2", 100, 10)
    assert class_packets(bed)[B] - before[B] >= 10

    rep = again.teardown()
    assert rep.ok and store.entries() == []


def _other_program(store: bpf_pins.PinStore, dev: str, foreign_map_only: bool, attached: int) -> None:
    """Overwrite ``dev``'s pins: another program and its maps, or the attached program with one foreign map."""
    with bpf_classify.ClassifierMaps.create() as maps:
        fd = bpf_classify.load(maps, 0xFFFFFFFF, mapcls.program_name(0xFFFFFFFF))
        try:
            files = {"prog": fd, **maps.pin_files()}
            if foreign_map_only:
                good = store.get(dev)
                try:
                    files = dict(good, map_src4=maps.maps["src4"].fd)
                    store.pin(dev, files)
                finally:
                    for v in good.values():
                        os.close(v)
            else:
                store.pin(dev, files)
        finally:
            os.close(fd)
    got = pinned(store, dev)
    assert (got[0] != attached) if not foreign_map_only else (got[0] == attached and got[2] != got[1])


@pytest.mark.parametrize("foreign_map_only", [False, True], ids=["other-program", "foreign-map"])
def test_a_pin_that_is_not_the_attached_program_is_replaced_and_repinned(bed, cfg_file, pinfs, monkeypatch,
                                                                         foreign_map_only):
    caps = probe_capabilities(bpffs_root=str(pinfs))
    node = open_node(caps, netns=bed.node)
    assert node.apply(load_config(cfg_file)).ok
    store = bpf_pins.PinStore(pinfs, bpf_pins.scope_for(bed.node)).sub("htb")
    old = attached_prog_id(bed)
    _other_program(store, "up0", foreign_map_only, old)

    refuse_by_id(monkeypatch)
    again = open_node(caps, netns=bed.node)
    rep = again.apply(load_config(cfg_file))
    ops = [op for b in rep.backends for t in b.targets for op in t.ops]
    assert rep.ok and [type(op).__name__ for op in ops] == ["AttachMapClassifier"], ops
    assert ("not the attached id" if not foreign_map_only else "is not a map of program") in ops[0].reason
    new = attached_prog_id(bed)
    prog_id, prog_maps, pin_maps = pinned(store, "up0")
    assert new != old and prog_id == new and pin_maps == prog_maps
    assert again.apply(load_config(cfg_file)).changes == 0  # re-pinned: adopted from now on
    before = class_packets(bed)
    bed.send("198.18.2.1", "198.18.0.2", 100, 10)
    assert class_packets(bed)[B] - before[B] >= 10  # the replacement classifies


def test_pins_of_a_vanished_device_and_a_crash_leftover_are_collected(bed, cfg_file, pinfs):
    bed.exec("ip", "link", "add", "up2", "type", "veth", "peer", "name", "up3")
    bed.exec("ip", "link", "set", "up2", "up")
    cfg_file.write_text(CFG.replace("interfaces: [up0]", "interfaces: [up0, up2]"))
    caps = probe_capabilities(bpffs_root=str(pinfs))
    node = open_node(caps, netns=bed.node)
    assert node.apply(load_config(cfg_file)).ok
    store = bpf_pins.PinStore(pinfs, bpf_pins.scope_for(bed.node)).sub("htb")
    assert store.entries() == ["up0", "up2"]
    # What a crash in the middle of pinning leaves: a temporary entry holding a pin.
    with bpf_maps.create_map(bpf_maps.MAP_ARRAY, 4, 4, 1, "shpd_crash") as m:
        tmp = store.base / "pinning:999999:up0"
        tmp.mkdir()
        bpf_pins.obj_pin(m.fd, tmp / "map_x")
    outside = pinfs / "someone-else"
    outside.mkdir()
    with bpf_maps.create_map(bpf_maps.MAP_ARRAY, 4, 4, 1, "not_ours") as m:
        bpf_pins.obj_pin(m.fd, outside / "map")

    bed.exec("ip", "link", "del", "up2")  # the device vanishes; its pins stay until collected
    rep = node.apply(load_config(cfg_file))
    unpinned = sorted(op.device for b in rep.backends for t in b.targets for op in t.ops
                      if isinstance(op, mapcls.UnpinMapClassifier))
    assert unpinned == ["pinning:999999:up0", "up2"], rep
    assert store.entries() == ["up0"]
    assert (outside / "map").exists()  # never outside shaperd's directory
    assert node.apply(load_config(cfg_file)).changes == 0  # collected once, in sync since


def test_devices_with_dots_in_their_names_pin_under_an_escaped_entry(bed, cfg_file, pinfs):
    bed.exec("ip", "link", "add", "up2.7", "type", "veth", "peer", "name", "up3")  # a VLAN's kind of name
    bed.exec("ip", "link", "set", "up2.7", "up")
    cfg_file.write_text(CFG.replace("interfaces: [up0]", "interfaces: [up2.7]"))
    caps = probe_capabilities(bpffs_root=str(pinfs))
    assert open_node(caps, netns=bed.node).apply(load_config(cfg_file)).ok
    store = bpf_pins.PinStore(pinfs, bpf_pins.scope_for(bed.node)).sub("htb")
    assert store.entries() == ["up2.7"] and (store.base / "up2%2e7" / "prog").exists()
    assert open_node(caps, netns=bed.node).apply(load_config(cfg_file)).changes == 0
