"""Pod resolution: one pod's failing route lookup is that pod's problem, not the reconcile's."""

from __future__ import annotations

from types import SimpleNamespace

from shaperd.discovery import pods
from shaperd.core.errors import KernelError
from shaperd.core.inventory import Link
from shaperd.kernel.rtnl_rows import RouteRow


class Reader:
    def route_to(self, ip):
        if ip == "198.18.9.9":  # under a blackhole route: the kernel answers EINVAL
            raise KernelError("get", f"route to {ip}", "node", "Invalid argument", 22)
        return RouteRow(2, 32, 254, 1, 0, 7, False)


def info(uid, ip):
    return SimpleNamespace(uid=uid, namespace="ns", name=uid, labels={}, ips=(ip,), host_network=False)


def test_a_failing_lookup_is_recorded_on_that_pod_and_the_others_resolve():
    links = (Link("up0", 2), Link("cali1", 7, kind="veth"))
    out = {p.uid: p for p in pods.resolve(Reader(), [info("bad", "198.18.9.9"), info("good", "198.18.5.5")], links, None)}
    assert out["good"].host_ifname == "cali1" and out["good"].problems == ()
    assert out["bad"].host_ifindex is None
    assert out["bad"].problems == ("get route to 198.18.9.9 on node: Invalid argument",)


def test_the_bandwidth_annotations_reach_the_inventory_pod_and_a_non_string_is_kept_to_be_refused():
    from shaperd.core.podcaps import EGRESS_ANNOTATION, INGRESS_ANNOTATION, NotAString

    links = (Link("up0", 2), Link("cali1", 7, kind="veth"))
    plain = SimpleNamespace(**vars(info("plain", "198.18.5.5")), annotations={})
    capped = SimpleNamespace(**vars(info("capped", "198.18.5.6")),
                             annotations={EGRESS_ANNOTATION: "100M", INGRESS_ANNOTATION: "50M", "x": "y"})
    odd = SimpleNamespace(**vars(info("odd", "198.18.5.7")), annotations={EGRESS_ANNOTATION: 100})
    out = {p.uid: p for p in pods.resolve(Reader(), [plain, capped, odd], links, None)}
    assert (out["plain"].egress_bandwidth, out["plain"].ingress_bandwidth) == (None, None)
    assert (out["capped"].egress_bandwidth, out["capped"].ingress_bandwidth) == ("100M", "50M")
    assert isinstance(out["odd"].egress_bandwidth, NotAString)  # refused by podcaps, not dropped
