"""Hypothesis strategies from a JSON schema (the subset pydantic's `model_json_schema()` emits), plus the
hostile mutations a fuzzer should also try: any JSON value in place of a field, extreme numbers, odd text.

Generated documents follow the schema's shape (types, enums, bounds, required keys), so most of them reach
the server's deeper checks; `hostile_documents` then breaks one field at a time.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

EXTREME_NUMBERS = st.sampled_from(
    [0, -1, 1, 2**31, -(2**31) - 1, 2**63, 2**64, 10**400, 1e308, -1e308, 1e-320, 0.5, -0.0]
)
ODD_TEXT = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ["", "\x00", "\u2028", "😀" * 10, "a" * 2000, "</s>", "<|im_end|>", "{{ 7*7 }}", "{% raise %}"]
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | EXTREME_NUMBERS | st.floats(allow_nan=False, allow_infinity=False) | ODD_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(ODD_TEXT, children, max_size=4),
    max_leaves=12,
)


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    return _strategy(schema, schema.get("$defs", {}))


def _strategy(node: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[Any]:
    if "$ref" in node:
        return st.deferred(lambda: _strategy(defs[node["$ref"].rsplit("/", 1)[1]], defs))
    if "anyOf" in node:
        return st.one_of([_strategy(option, defs) for option in node["anyOf"]])
    if "const" in node:
        return st.just(node["const"])
    if "enum" in node:
        return st.sampled_from(node["enum"])
    kind = node.get("type")
    if kind == "object":
        return _object(node, defs)
    if kind == "array":
        items = _strategy(node.get("items", {}), defs)
        return st.lists(items, min_size=node.get("minItems", 0), max_size=min(node.get("maxItems", 5), 5))
    if kind == "string":
        return st.text(max_size=min(node.get("maxLength", 30), 30))
    if kind == "integer":
        return st.integers(node.get("minimum"), node.get("maximum")) | EXTREME_NUMBERS.filter(
            lambda v: isinstance(v, int)
        )
    if kind == "number":  # mostly plausible sampling values (so requests reach generation), sometimes any
        low, high = node.get("minimum"), node.get("maximum")
        return st.floats(0.0, 1.0) | st.floats(low, high, allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return JSON_VALUES  # {} (any value): dict[str, Any] and the like


def _object(node: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    properties = node.get("properties", {})
    if not properties:  # a free-form mapping (dict[str, float], dict[str, Any])
        extra = node.get("additionalProperties")
        values = _strategy(extra if isinstance(extra, dict) else {}, defs)
        return st.dictionaries(st.text(max_size=10), values, max_size=3)
    required = {k: _strategy(v, defs) for k, v in properties.items() if k in node.get("required", ())}
    optional = {k: _strategy(v, defs) for k, v in properties.items() if k not in node.get("required", ())}
    return st.fixed_dictionaries(required, optional=optional)


@st.composite
def hostile_documents(draw: st.DrawFn, schema: dict[str, Any]) -> Any:
    """A schema-shaped document, then (mostly) one field replaced by any JSON value, or an unrelated value."""
    document = draw(from_schema(schema))
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return draw(JSON_VALUES)
    if choice <= 4 and isinstance(document, dict):
        key = draw(st.sampled_from(sorted(schema.get("properties", {}))))
        document[key] = draw(JSON_VALUES)
    return document
