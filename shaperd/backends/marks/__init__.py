"""Mark programs on host-side pod interfaces: each tenant pod's packets carry its tenant in skb->mark.

objects and ops (data), plan and diff (pure), backend (the protocol).
"""
