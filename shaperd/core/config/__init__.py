"""The tenants file: loading, validation and the normalised config model.

Owns the meaning of ``traffic-shaping.yaml``: the source design's keys
(``tenants[].name/bandwidthGuarantee/bandwidthLimit/priority``) unchanged, and
shaperd's extensions (``node.*``, ``tenants[].match``). One module per step:
model.py (the dataclasses), yamldoc.py (safe YAML), validate.py (every problem
with its field path), loader.py (a file or text to a Config), limits.py (input
budgets), manifests.py (multi-document files), cilium.py (Cilium bandwidth
annotations). This package re-exports the names callers use.

Pure: reads only the file it is given.
"""

from shaperd.core.config.loader import load_file, load_text  # noqa: F401
from shaperd.core.config.model import (  # noqa: F401
    IPNetwork, CONFIGMAP_KEY, DEFAULT_POD_LABEL, NAME_RE, IFNAME_GLOB_RE, Match,
    Destination, Ingress, RdmaDeviceRef, Rdma, Tenant, Node, DATAPLANES,
    HTB_OFFLOAD_MODES, Config, DEFAULT_RESERVE_FRACTION, default_reserve_bps, check_guarantee_sum,
    check_ingress_sum,
)
from shaperd.core.config.validate import PRIORITY_FROM, from_dict  # noqa: F401
from shaperd.core.errors import ConfigError, ConfigProblem  # noqa: F401 - what loading raises
