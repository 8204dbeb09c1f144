"""bench/class_sampler.py reads iproute2's ``tc -s class|qdisc show`` text (6.1 prints HTB's class stats as
text even with -j): every field it keeps, from a recorded dump."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "class_sampler", Path(__file__).resolve().parents[2] / "bench" / "class_sampler.py")
sampler = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(sampler)

CLASSES = """class htb 7368:1 root rate 100Gbit ceil 100Gbit burst 12500000b cburst 12500000b 
 Sent 5881224368 bytes 3900112 pkt (dropped 0, overlimits 28338 requeues 0) 
 backlog 0b 0p requeues 0
 lended: 0 borrowed: 0 giants: 0
 tokens: -2591 ctokens: -2591

class htb 7368:7ba9 parent 7368:1 leaf 7ba9: prio 2 rate 2Gbit ceil 10Gbit burst 1600000b cburst 1600000b 
 Sent 1770548697 bytes 1170000 pkt (dropped 3, overlimits 732 requeues 0) 
 backlog 4196266b 63p requeues 0
 lended: 1200 borrowed: 5400 giants: 0
 tokens: -4235 ctokens: -600
"""
QDISCS = """qdisc htb 7368: root refcnt 3 r2q 10 default 0x2 direct_packets_stat 0 direct_qlen 1000
 Sent 70 bytes 1 pkt (dropped 0, overlimits 0 requeues 0) 
 backlog 0b 0p requeues 0
qdisc bfifo 7ba9: parent 7368:7ba9 limit 6250000b
 Sent 1770548697 bytes 1170000 pkt (dropped 3, overlimits 0 requeues 0) 
 backlog 4196266b 63p requeues 0
"""


def test_class_stats_are_read_from_the_text():
    root, leaf = sampler.parse_stats(CLASSES)
    assert root == {"kind": "htb", "handle": "7368:1", "parent": None, "bytes": 5881224368, "packets": 3900112,
                    "drops": 0, "overlimits": 28338, "backlog": 0, "qlen": 0, "lended": 0, "borrowed": 0,
                    "giants": 0, "tokens": -2591, "ctokens": -2591}
    assert (leaf["parent"], leaf["drops"], leaf["backlog"], leaf["qlen"], leaf["borrowed"], leaf["ctokens"]) == (
        "7368:1", 3, 4196266, 63, 5400, -600)


def test_qdisc_stats_are_read_from_the_text():
    htb, fifo = sampler.parse_stats(QDISCS)
    assert (htb["kind"], htb["handle"], htb["parent"]) == ("htb", "7368:", None)
    assert (fifo["kind"], fifo["parent"], fifo["drops"], fifo["backlog"]) == ("bfifo", "7368:7ba9", 3, 4196266)
