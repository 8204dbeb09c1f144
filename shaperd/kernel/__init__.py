"""Generic kernel I/O: netlink messages and exchanges, the bounded writer, rtnetlink reads, bpf, netns, probes.

The only layer that speaks netlink or opens devices (with the backends' own kernel_*.py encoders,
which use it); it never imports a backend.
"""
