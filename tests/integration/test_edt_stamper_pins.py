"""The EDT stamper's maps through bpffs pins (a private bpffs per test, never the host's /sys/fs/bpf).

The kernel side directly (the host lacks sch_fq, so not the backend): tc.apply_ops loads the stamper
with the "edt-stamper" PinStore (LOADERS -> edt_prog.load_fresh pins it as the device's entry) and
attaches it on a veth's clsact egress in a fresh namespace; open_for_device then adopts its maps
through the pins with the by-id commands (CAP_SYS_ADMIN) made to fail with EPERM; a pin of another
program is refused with a typed PinError naming the device; the edt backend's diff collects the pins
of a device that left edt and apply removes them, and nothing outside the stampers' part of the scope.
"""

from __future__ import annotations

import errno
import os

import pytest

from shaperd.backends.edt import ops as edt_ops
from shaperd.backends.edt.backend import EdtBackend, EdtObserved
from shaperd.backends.edt.objects import Stamper, stamper_name
from shaperd.backends.edt.plan import EdtPlan
from shaperd.backends.common.clsact import AddClsact
from shaperd.backends.edt.kernel_tc import CODEC as EDT_CODEC
from shaperd.kernel import bpf_maps
from shaperd.kernel import bpf_pins
from shaperd.backends.edt import kernel_stamper as edt_prog
from shaperd.kernel import tc
from shaperd.kernel.rtnl import RtnlReader
from shaperd_bed import netns

from .conftest import needs_root

pytestmark = needs_root
HORIZON_NS = 2_000_000


def _eperm(*_a, **_kw):
    raise bpf_maps.BpfMapError("get bpf object by id: Operation not permitted (CAP_SYS_ADMIN)", errno.EPERM)


@pytest.fixture
def no_by_id(monkeypatch):
    """What the DaemonSet's capabilities give: the by-id commands refused."""
    monkeypatch.setattr(bpf_maps, "prog_fd_by_id", _eperm)
    monkeypatch.setattr(bpf_maps, "open_map_by_id", _eperm)


@pytest.fixture
def node():
    """A fresh namespace with veth st0 (clsact, the stamper attached there by the test), and its reader/writer."""
    with netns.Namespaces(stop_grace_s=0) as nets:
        ns = nets.add(f"edtpin-{os.getpid()}")
        netns.run(["ip", "-n", ns, "link", "add", "st0", "type", "veth", "peer", "name", "st1"])
        reader, writer = RtnlReader(ns), tc.open_writer(ns)
        try:
            yield ns, reader, writer
        finally:
            writer.close()
            reader.close()


def _attach(reader, writer, pins, q16=((3, 1234),), device="st0", clsact=True):
    link = next(l for l in reader.links() if l.name == device)
    st = Stamper(stamper_name(HORIZON_NS), HORIZON_NS)
    kw = dict(device=device, ifindex=link.ifindex)
    ops = [AddClsact(**kw)] if clsact else []
    res = tc.apply_ops(writer, ops + [edt_ops.SetStamper(stamper=st, initial_q16=q16, **kw)], pins=pins, codec=EDT_CODEC)
    assert res.failed == [] and not res.batch_failed
    (f,) = [f for f in reader.filters(link.ifindex, 0xFFFFFFF3, device) if f.kind == "bpf"]
    return link.ifindex, st, f.prog_id


def test_the_controller_adopts_the_stampers_maps_through_the_pins_without_by_id(node, pinfs, no_by_id):
    _ns, reader, writer = node
    store = bpf_pins.PinStore(pinfs, "host").sub(edt_prog.STAMPER_PINS)
    ifindex, st, prog_id = _attach(reader, writer, store)
    assert store.entries() == ["st0"]
    assert sorted(os.listdir(store.path("st0"))) == ["map_clocks", "map_parents", "map_rates", "map_stats", "prog"]
    with pytest.raises(bpf_maps.BpfMapError) as by_id:  # as the agent without CAP_SYS_ADMIN sees it today
        edt_prog.open_for_device(reader, ifindex, "st0", st.name)
    assert by_id.value.errno == errno.EPERM
    with edt_prog.open_for_device(reader, ifindex, "st0", st.name, store) as maps:
        assert maps.read_rates([3, 4]) == {3: 1234, 4: 0}  # the first rates load_fresh wrote
        maps.write_rates({4: 99})
    with edt_prog.open_for_device(reader, ifindex, "st0", st.name, store) as again:
        assert again.read_rates([4]) == {4: 99}  # the same maps: the program's, not a copy
    # Replacing the stamper (a SetStamper again) re-pins: the entry follows the attached program.
    _i, _s, new_id = _attach(reader, writer, store, q16=((3, 777),), clsact=False)
    assert new_id != prog_id
    with edt_prog.open_for_device(reader, ifindex, "st0", st.name, store) as maps:
        assert maps.read_rates([3]) == {3: 777}


def test_a_pin_of_another_program_is_refused_with_a_typed_error_naming_the_device(node, pinfs, no_by_id):
    _ns, reader, writer = node
    store = bpf_pins.PinStore(pinfs, "host").sub(edt_prog.STAMPER_PINS)
    ifindex, st, _prog_id = _attach(reader, writer, store)
    # Another stamper, loaded and pinned as st0's entry but never attached (a crash between pin and attach).
    os.close(edt_prog.load_fresh(HORIZON_NS, {3: 1}, store, "st0"))
    with pytest.raises(bpf_pins.PinError) as e:
        edt_prog.open_for_device(reader, ifindex, "st0", st.name, store)
    assert e.value.errno == errno.ESTALE
    assert "adopt edt stamper maps on st0: pinned program id" in str(e.value) and "is not the attached id" in str(e.value)
    # No pins at all for a device: typed, ENOENT, naming it.
    store.remove("st0")
    with pytest.raises(bpf_pins.PinError) as gone:
        edt_prog.open_for_device(reader, ifindex, "st0", st.name, store)
    assert gone.value.errno == errno.ENOENT and "st0" in str(gone.value)


def test_the_pins_of_a_device_no_longer_on_edt_are_collected_and_nothing_else(node, pinfs):
    _ns, reader, writer = node
    root = bpf_pins.PinStore(pinfs, "host")
    backend = EdtBackend(writer, pins=root)
    ifindex, st, _ = _attach(reader, writer, backend.stamper_pins)
    # The map classifier's part (<scope>/edt) is not the stampers': an entry there must survive.
    other = edt_prog.load_fresh(HORIZON_NS, {}, root.sub("edt"), "st0")
    os.close(other)
    observed = EdtObserved(stamper_pin_entries=backend.stamper_pins.entries())
    assert observed.stamper_pin_entries == ["st0"]
    kept = backend.diff(EdtPlan(devices=(), skipped=("st0",)), observed)
    assert [op for d in kept for op in d.ops if isinstance(op, edt_ops.UnpinStamper)] == []
    diffs = [d for d in backend.diff(EdtPlan(devices=()), observed)
             if any(isinstance(op, edt_ops.UnpinStamper) for op in d.ops)]
    assert [d.target for d in diffs] == ["st0 (edt stamper bpffs pins)"]
    for d in diffs:
        res = backend.apply(d)
        assert res.failed == [] and len(res.applied) == 1
    assert backend.stamper_pins.entries() == []
    assert root.sub("edt").entries() == ["st0"]
    # The stamper itself lives on (its filter holds it): unpinning is not a detach.
    assert [f.name for f in reader.filters(ifindex, 0xFFFFFFF3, "st0") if f.kind == "bpf"] == [st.name]
