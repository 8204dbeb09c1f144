"""The engine: the backend registry, one reconcile over every backend (reconciler.py), fallbacks, probes, config watch."""
