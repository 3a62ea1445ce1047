"""Which modules a checkpoint's ignore / modules_to_not_convert patterns leave 16-bit (quant/ignored.py)."""

from __future__ import annotations

import pytest
from kvpilot.runtime.errors import UnsupportedModelError
from kvpilot.runtime.quant.ignored import ignored_patterns, is_ignored, stays_16bit

NAME = "model.layers.1.mlp.down_proj"


@pytest.mark.parametrize(
    ("pattern", "ignored"),
    [
        (NAME, True),
        ("mlp.down_proj", True),  # whole dotted parts
        ("model.layers.1", True),
        ("model.layers.10", False),
        ("down", False),  # not a whole part
        ("re:.*down_proj$", True),
        ("re:layers", False),  # matched from the start of the name
        ("lm_head", False),
    ],
)
def test_patterns(pattern: str, ignored: bool) -> None:
    assert is_ignored(NAME, (pattern,)) is ignored


def test_fused_modules_need_all_parts() -> None:
    parts = [f"model.layers.0.self_attn.{p}_proj" for p in "qkv"]
    assert stays_16bit("model.layers.0.self_attn.qkv_proj", parts, ("self_attn",))
    assert not stays_16bit("model.layers.0.self_attn.qkv_proj", parts, ("mlp",))
    with pytest.raises(UnsupportedModelError, match=r"leaves model\.layers\.0\.self_attn\.k_proj in 16-bit"):
        stays_16bit("model.layers.0.self_attn.qkv_proj", parts, ("k_proj",))


def test_config_fields_are_checked() -> None:
    raw = {"ignore": ["lm_head"], "modules_to_not_convert": ["re:.*gate$"], "ignored_layers": []}
    assert ignored_patterns(raw) == ("lm_head", "re:.*gate$")
    with pytest.raises(UnsupportedModelError, match="modules_to_not_convert must be a list of module names"):
        ignored_patterns({"modules_to_not_convert": "lm_head"})
    with pytest.raises(UnsupportedModelError, match="not a regular expression"):
        ignored_patterns({"ignore": ["re:(unclosed"]})


def test_gptqmodel_dynamic_skips_and_overrides() -> None:
    """GPTQModel's dynamic: "-:" keys leave modules 16-bit; an override repeating the checkpoint's own
    values is harmless; one changing bits or group size is refused, naming the key."""
    base = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    dynamic = {r"-:model\.layers\.0\..*": {}, r"+:.*down_proj": {"bits": 4, "group_size": 128}}
    patterns = ignored_patterns({**base, "dynamic": dynamic})
    assert patterns == (r"re:model\.layers\.0\..*",)
    assert is_ignored("model.layers.0.mlp.up_proj", patterns)
    assert not is_ignored("model.layers.10.mlp.up_proj", patterns)
    with pytest.raises(UnsupportedModelError) as err:
        ignored_patterns({**base, "dynamic": {r".*\.1\..*": {"bits": 8}}})
    assert r"dynamic['.*\\.1\\..*'] sets {'bits': 8}" in str(err.value)
    assert "per-module quantization is not supported" in str(err.value)
    with pytest.raises(UnsupportedModelError, match="not a regular expression"):
        ignored_patterns({**base, "dynamic": {"-:(unclosed": {}}})
    with pytest.raises(UnsupportedModelError, match="must be an object of overrides"):
        ignored_patterns({**base, "dynamic": {".*": [8]}})
