"""Tenant ingress: an IFB fed from each shaped uplink's ingress, with an HTB tree keyed on the destination.

objects and ops (data), plan and diff (pure), backend (the protocol), kernel_tc (its codec), status and
metrics (reads), spec (its registry entry). docs/ingress.md says what it governs and what it cannot promise.
"""
