"""The shaperd command line: one module per command group; main.py builds the parser from their register()."""
