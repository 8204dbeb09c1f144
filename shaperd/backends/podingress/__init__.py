"""Per-pod ingress caps: a tbf root qdisc on each capped pod's host-side interface (kubernetes.io/ingress-bandwidth).

objects and ops (data), plan, diff and render (pure), kernel_tc (the codec), backend (the protocol), labels
(the record status reads), status and metrics (read only), spec (the registry entry).
"""
