"""What HTB offload (mlx5) cannot express in a plan: the reasons that keep a device in software HTB."""

import ipaddress

from shaperd import config
from shaperd.backends.htb.offload import MLX5_MAX_LEAVES, verdict
from shaperd.backends.htb.plan import plan
from shaperd.inventory import Capabilities, Inventory, Link


def device_plan(tenants):
    c = config.from_dict({"node": {"interfaces": ["eth0"], "capacity": "100Gbps"}, "tenants": tenants})
    (dp,) = plan(c, Inventory(links=(Link("eth0", 2),), capabilities=Capabilities(bpf=True))).devices
    return dp


def test_equal_tenants_classified_on_clsact_can_be_offloaded_where_the_device_can():
    dp = device_plan([{"name": "a", "bandwidthGuarantee": "10Gbps"}, {"name": "b", "bandwidthGuarantee": "10Gbps"}])
    # The default class (reserve 1 Gbit, prio 7) differs from the tenants in prio and quantum: offload says so.
    v = verdict(dp, supported=True)
    assert not v.possible
    assert any("prio" in r for r in v.reasons) and any("quantum" in r for r in v.reasons)


def test_every_reason_is_named():
    tenants = [{"name": f"t{i}", "bandwidthGuarantee": "100Mbps", "priority": i % 3,
                "match": {"cidrs": [f"198.18.{i // 250}.{i % 250}/32"]}} for i in range(MLX5_MAX_LEAVES + 1)]
    dp = device_plan(tenants)
    v = verdict(dp, supported=False, why_not="htb offload on eth0: Operation not supported")
    text = " | ".join(v.reasons)
    assert "not supported on eth0: htb offload on eth0: Operation not supported" in text
    assert f"{MLX5_MAX_LEAVES + 2} leaf classes" in text  # tenants + the default class
    assert "filters on the HTB root (cls_bpf mark, u32)" in text
    assert ipaddress.ip_network("198.18.0.0/15")  # addresses used above are from the test range
