"""Enforcement backends: one folder per path, each behind the protocol in core/protocol.py, listed by its spec.py
(engine/registry.py); shared tc rules in common/."""
