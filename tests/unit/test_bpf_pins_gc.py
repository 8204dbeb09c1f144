"""Which bpffs pin entries the HTB backend collects (pure: no kernel), and the entry names bpffs takes.

bpffs refuses names with a '.', so device names are escaped reversibly; the diff unpins every entry
that no device shaped with the eBPF map classifier claims (gone, deselected, u32, a crash's
temporary entry), keeps those of devices that failed to plan, and in sync emits nothing."""

from __future__ import annotations

import pytest

from shaperd.backends.htb.backend import HtbBackend, HtbObserved
from shaperd.backends.common.mapcls import UnpinMapClassifier
from shaperd.backends.htb.plan import HtbPlan
from shaperd.kernel import bpf_pins


@pytest.mark.parametrize("name", ["eth0", "eth0.100", "a%2eb", "100%.", "bond0.7.3"])
def test_escape_is_reversible_and_dot_free(name):
    esc = bpf_pins.escape(name)
    assert "." not in esc and bpf_pins.unescape(esc) == name


def test_scope_and_entry_paths_stay_under_shaperds_directory(tmp_path):
    store = bpf_pins.PinStore(tmp_path, bpf_pins.scope_for("ns.a"))
    assert store.base == tmp_path / "shaperd" / "netns-ns%2ea"
    assert store.path("eth0.5") == store.base / "eth0%2e5"
    assert bpf_pins.scope_for(None) == "host"
    assert store.path("..") == store.base / "%2e%2e"  # escaped: no way out of the scope
    for bad in ("", "a/b"):
        with pytest.raises(ValueError):
            store.path(bad)


def _unpinned(plan: HtbPlan, entries) -> list[str]:
    be = HtbBackend(writer=None, pins=bpf_pins.PinStore("/nonexistent"))
    diffs = be.diff(plan, HtbObserved(pin_entries=entries))
    ops = [op for d in diffs for op in d.ops]
    assert all(isinstance(op, UnpinMapClassifier) and op.ifindex == 0 for op in ops)
    return sorted(op.device for op in ops)


def test_entries_no_shaped_device_claims_are_collected_and_failing_devices_keep_theirs():
    plan = HtbPlan(skipped=("eth1",))
    assert _unpinned(plan, ["eth0", "eth1", "pinning:42:eth1"]) == ["eth0", "pinning:42:eth1"]
    assert _unpinned(plan, ["eth1"]) == []  # in sync: no write
    assert _unpinned(plan, None) == []  # unreadable (or no pins): nothing collected


def test_teardown_unpins_every_entry():
    be = HtbBackend(writer=None, pins=bpf_pins.PinStore("/nonexistent"))
    diffs = be.teardown(HtbObserved(pin_entries=["eth0", "pinning:1:eth0"]))
    assert sorted(op.device for d in diffs for op in d.ops) == ["eth0", "pinning:1:eth0"]
