"""HTB on the uplinks: one class per tenant (rate = guarantee, ceil = limit), filters that classify.

objects (data), plan (pure), diff (pure), ops (typed writes), observe
(kernel rows -> data), render (equivalent tc commands), backend (the protocol).
"""
