"""The shaperd command line (the top layer): one module per command group; main.py builds the parser from their register()."""
