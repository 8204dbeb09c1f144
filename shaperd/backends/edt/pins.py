"""Where edt's stampers are pinned: the "edt-stamper" part of the node's bpffs scope, from the probe's answer.

The same store for the backend (which pins at apply), its rate controller loop and ``shaperd status``
(which find the maps again through it). None: the maps are found by program id.
"""

from __future__ import annotations

from shaperd.backends.edt.kernel_stamper import STAMPER_PINS
from shaperd.core.inventory import Capabilities
from shaperd.kernel import bpf_pins


def stamper_pins(caps: Capabilities | None, netns: str | None):
    """The edt stampers' bpffs PinStore, or None: their maps found by id (also None without a probe)."""
    if caps is None:
        return None
    root = caps.edt_pin_root or (caps.bpf_pin_root if caps.bpf_adopt == "pins" else "")
    return bpf_pins.PinStore(root, bpf_pins.scope_for(netns)).sub(STAMPER_PINS) if root else None
