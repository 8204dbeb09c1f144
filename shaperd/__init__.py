"""shaperd: per-tenant egress bandwidth enforcement for multi-tenant GPU nodes."""
__version__ = "0.1.0"
