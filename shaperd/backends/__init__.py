"""Enforcement backends: one sub-package per path, all behind the protocol in base.py."""
