"""Which EDT stamper pin entries the edt backend collects (pure: no kernel).

The stampers' pins live in their own part of the scope (<scope>/edt-stamper, a sibling of the map
classifier's <scope>/edt): every entry no edt device claims (it left edt, it is gone, a crash's
temporary entry) is unpinned, a device that failed to plan keeps its entry, teardown unpins all,
and without pins (or an unreadable directory: entries None) nothing is collected."""

from __future__ import annotations

from shaperd.backends.edt.backend import EdtBackend, EdtObserved
from shaperd.backends.edt.diff import stale_stamper_pins
from shaperd.backends.edt.objects import EdtDevicePlan, FqQdisc, Stamper
from shaperd.backends.edt.ops import UnpinStamper
from shaperd.backends.edt.plan import EdtPlan
from shaperd.backends.common.mapcls import UnpinMapClassifier
from shaperd.kernel import bpf_pins

DP = EdtDevicePlan("up0", 7, 10_000_000_000, 1, "fq", (FqQdisc(0xFFFFFFFF, 0x73650000, 10000, 100, 2000, True),),
                   Stamper("shpe_s2000", 2_000_000))


def _unpins(diffs, kind=UnpinStamper) -> list[str]:
    return sorted(op.device for d in diffs for op in d.ops if isinstance(op, kind))


def test_the_stamper_pins_are_a_sibling_of_the_classifiers_not_inside_them():
    be = EdtBackend(writer=None, pins=bpf_pins.PinStore("/fs", "host"))
    assert str(be.stamper_pins.base) == "/fs/shaperd/host/edt-stamper"
    assert str(be.pins.base) == "/fs/shaperd/host/edt"
    assert EdtBackend(writer=None).stamper_pins is None


def test_entries_no_edt_device_claims_are_unpinned_skipped_ones_kept():
    be = EdtBackend(writer=None, pins=bpf_pins.PinStore("/nonexistent"))
    obs = EdtObserved(stamper_pin_entries=["gone0", "pinning:12:up0", "stuck0", "up0"])
    diffs = be.diff(EdtPlan(devices=(DP,), skipped=("stuck0",)), obs)
    assert _unpins(diffs) == ["gone0", "pinning:12:up0"]
    assert _unpins(diffs, UnpinMapClassifier) == []  # the classifier's part is judged on its own entries
    assert all(op.ifindex == 0 and op.reason == "device no longer on the edt data plane"
               for d in diffs for op in d.ops if isinstance(op, UnpinStamper))


def test_in_sync_and_without_pins_nothing_is_collected():
    be = EdtBackend(writer=None, pins=bpf_pins.PinStore("/nonexistent"))
    assert _unpins(be.diff(EdtPlan(devices=(DP,)), EdtObserved(stamper_pin_entries=["up0"]))) == []
    assert _unpins(be.diff(EdtPlan(devices=()), EdtObserved(stamper_pin_entries=None))) == []
    assert stale_stamper_pins(None, set(), "x") == []


def test_teardown_unpins_every_stamper_entry():
    be = EdtBackend(writer=None, pins=bpf_pins.PinStore("/nonexistent"))
    diffs = be.teardown(EdtObserved(stamper_pin_entries=["up0", "up1"]))
    assert _unpins(diffs) == ["up0", "up1"]
    assert [d.target for d in diffs] == ["up0 (edt stamper bpffs pins)", "up1 (edt stamper bpffs pins)"]
