"""The running agent: the daemon loop that composes the engine and reporting (``shaperd run``)."""
