"""The engine: one reconcile over every backend (reconciler.py), and the loop that triggers it (daemon.py)."""
