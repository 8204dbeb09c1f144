"""node.dataplane: the loader's field, and which backend plans each uplink (backends/edt/select.py)."""

import pytest

from shaperd.core import config
from shaperd.backends.htb.plan import plan as htb_plan
from shaperd.core.errors import ConfigError
from shaperd.core.inventory import Capabilities, Inventory, Link
from shaperd.core.tenancy import tenancy

EDT_KERNEL = Capabilities(bpf=True, bpf_maps=True, fq=True, mq=True, leaf_kinds=frozenset({"fq_codel"}))
NO_FQ = Capabilities(bpf=True, fq=False, mq=True)


def cfg(dataplane: str | None, capacity: str | None = None):
    node = {"interfaces": ["eth*"]}
    if dataplane is not None:
        node["dataplane"] = dataplane
    if capacity:
        node["capacity"] = capacity
    return config.from_dict({"node": node, "tenants": [{"name": "a", "bandwidthGuarantee": "100Mbps"}]})


def inv(caps, *links):
    return Inventory(links=links, capabilities=caps)


FAST = Link("eth0", 2, speed_bps=100_000_000_000, tx_queues=8)
SLOW = Link("eth1", 3, speed_bps=1_000_000_000, tx_queues=1)


def test_default_is_htb_and_bad_values_name_the_field():
    assert cfg(None).node.dataplane == "htb"
    with pytest.raises(ConfigError, match="node.dataplane"):
        cfg("fast")


def test_auto_picks_edt_by_link_speed_where_the_kernel_can():
    ten = tenancy(cfg("auto"), inv(EDT_KERNEL, FAST, SLOW))
    assert ten.dataplanes == {"eth0": "edt", "eth1": "htb"}
    # HTB does not plan the device edt owns.
    assert [d.device for d in htb_plan(cfg("auto"), inv(EDT_KERNEL, FAST, SLOW), ten=ten).devices] == ["eth1"]


def test_without_sch_fq_auto_and_edt_fall_back_to_htb_and_say_why():
    ten = tenancy(cfg("auto"), inv(NO_FQ, FAST))
    assert ten.dataplanes == {"eth0": "htb"}
    assert any("edt unavailable: sch_fq missing" in w for w in ten.warnings)
    ten = tenancy(cfg("edt"), inv(NO_FQ, FAST))
    assert ten.dataplanes == {"eth0": "htb"}
    assert any("eth0: edt unavailable: sch_fq missing" in w for w in ten.warnings)


def test_edt_forced_applies_to_every_uplink():
    ten = tenancy(cfg("edt", "1Gbps"), inv(EDT_KERNEL, FAST, SLOW))
    assert ten.dataplanes == {"eth0": "edt", "eth1": "edt"}


def test_edt_needs_the_map_classifier_and_falls_back_to_htb_on_the_u32_path():
    # The stamper paces by the tenant class the map classifier writes into skb->priority: on the u32 path
    # (SHAPERD_CLASSIFIER=u32, or maps that could not be adopted) every packet would be "no tenant".
    u32_path = Capabilities(bpf=True, bpf_maps=False, fq=True, mq=True)
    ten = tenancy(cfg("edt"), inv(u32_path, FAST))
    assert ten.dataplanes == {"eth0": "htb"}
    assert any("eBPF map classifier unavailable" in w and "enforcing with htb" in w for w in ten.warnings), ten.warnings
