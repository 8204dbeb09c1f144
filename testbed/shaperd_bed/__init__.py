"""Isolation test bed: real namespaces, veths, TBF and iperf3 on one machine.

The bed reproduces the source design's isolation table on a single Linux
host.  It owns nothing in the shaperd core: it builds a throw-away topology
(tenant pods -> node -> wire -> recv), drives real TCP/UDP traffic through it
and measures per-tenant goodput, while shaperd (or a hand-written ``tc``
baseline) programs the node's uplink.

Modules, each owning one thing:

* :mod:`.netns`     - namespaces, veths, addresses, commands and processes in
                      a namespace, total cleanup; shared with shaperd's tests
                      and benchmarks (the one namespace helper of the repo).
* :mod:`.topology`  - names, addresses, building and removing the topology
                      (on :mod:`.netns`); the :class:`Bed` context manager and
                      signal handling.
* :mod:`.parse`     - pure parsing of iperf3 JSON and ping output, windows.
* :mod:`.traffic`   - iperf3 servers/clients, UDP flood, RTT probe.
* :mod:`.shaping`   - how the node is shaped: shaperd CLI hook, hand tc.
* :mod:`.scenarios` - the seven scenarios and the baseline run.
* :mod:`.report`    - the source design's table with measured numbers.
* :mod:`.demo`      - the ``shaperd demo`` subcommand.
"""
from .topology import Bed, BedConfig, TenantSpec, default_tenants  # noqa: F401

__all__ = ["Bed", "BedConfig", "TenantSpec", "default_tenants"]
