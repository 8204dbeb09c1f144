"""Reporting: metrics and their HTTP endpoint, health, the samplers, and the status and top frames over the registry."""
