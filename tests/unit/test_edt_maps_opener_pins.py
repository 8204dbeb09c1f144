"""The daemon's edt rate loop opens the stampers' maps through the same bpffs PinStore the edt backend
pins into (the "edt-stamper" part of the reconciler's scope) when the probe chose pins, else by id."""

from __future__ import annotations

from shaperd.backends.edt.backend import EdtBackend
from shaperd.backends.edt import pins as daemon  # the loop, the backend and status share it
from shaperd.core.inventory import Capabilities
from shaperd.kernel import bpf_pins


def test_the_loop_uses_the_backends_stamper_pins_when_the_probe_chose_pins():
    caps = Capabilities(bpf_adopt="pins", bpf_pin_root="/fs")
    got = daemon.stamper_pins(caps, "n1")
    want = EdtBackend(writer=None, pins=bpf_pins.PinStore("/fs", bpf_pins.scope_for("n1"))).stamper_pins
    assert got is not None and got.base == want.base == bpf_pins.PinStore("/fs", "netns-n1").base / "edt-stamper"


def test_by_id_without_pins():
    assert daemon.stamper_pins(Capabilities(bpf_adopt="id"), None) is None
    assert daemon.stamper_pins(None, None) is None


def test_stamper_pins_without_the_classifiers():
    # Debian 6.1 without CAP_PERFMON: the verifier refuses the map classifier (u32 path, no classifier pins),
    # but the stamper loaded and came back through pins: the backend and the loop both use them.
    from shaperd.engine.reconciler import default_backends

    caps = Capabilities(bpf_adopt="", edt_pin_root="/fs")
    got = daemon.stamper_pins(caps, None)
    assert got is not None and got.base == bpf_pins.PinStore("/fs", "host").base / "edt-stamper"
    (edt,) = [b for b in default_backends(None, pins=None, capabilities=caps) if b.name == "edt"]
    assert edt.stamper_pins is not None and edt.stamper_pins.base == got.base and edt.pins is None
