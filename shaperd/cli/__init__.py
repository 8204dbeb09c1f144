"""The command line: ``shaperd`` and its command groups, one module each (the top layer)."""
