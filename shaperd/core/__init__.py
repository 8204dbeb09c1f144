"""The pure core: the config model, units, inventory, tenancy, ids, errors and the backend protocol's types.

The bottom layer: it imports nothing else of shaperd and does no kernel I/O.
"""
