"""The published JSON Schema agrees with the loader on structure."""

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from shaperd.core import config
from shaperd.core.config import validate
from shaperd.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "schema" / "traffic-shaping.schema.json").read_text())


@pytest.mark.parametrize("name", ["source-design.yaml", "full.yaml"])
def test_examples_validate(name):
    jsonschema.validate(yaml.safe_load((ROOT / "examples" / name).read_text()), SCHEMA)


@pytest.mark.parametrize(
    "doc",
    [
        {"tenants": [{"name": "a", "bandwidthGuarantee": "1Gbps", "colour": "red"}]},
        {"tenants": [{"name": "a", "bandwidthGuarantee": "40gbps"}]},
        {"tenants": [{"name": "a", "bandwidthGuarantee": 40}]},
        {"tenants": [{"name": "a"}]},
        {"tenants": []},
        {"node": {"capcity": "1Gbps"}, "tenants": [{"name": "a", "bandwidthGuarantee": "1Gbps"}]},
        {"tenants": [{"name": "a", "bandwidthGuarantee": "1Gbps", "priority": "high"}]},
    ],
)
def test_schema_and_loader_both_reject(doc):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)
    with pytest.raises(ConfigError):
        config.from_dict(doc)


def test_schema_names_every_key_the_loader_accepts():
    props = SCHEMA["properties"]
    tenant = props["tenants"]["items"]["properties"]
    assert set(props) == validate._TOP_KEYS
    assert set(props["node"]["properties"]) == validate._NODE_KEYS
    assert set(tenant) == validate._TENANT_KEYS
    assert set(tenant["match"]["properties"]) == validate._MATCH_KEYS
