"""One KV-cache formula: the operator's sizing, kvpilot.contracts.kv_cache and what the runtime allocates
(model_runner.kv_block_bytes) agree on every model shape the runtime loads; the two config.json readers
(the operator's ModelFacts, the runtime's ModelConfig) read the same shape."""

from __future__ import annotations

import contextlib

import pytest
import torch
from kvpilot.contracts import kv_cache
from kvpilot.operator.planning.model_facts import facts_from_config
from kvpilot.operator.planning.sizing import kv_bytes_per_token
from kvpilot.runtime.config import ModelConfig
from kvpilot.runtime.engine.model_runner import kv_block_bytes, resolve_kv_cache_dtype
from kvpilot.runtime.errors import ModelLoadError, UnsupportedModelError

from tests.contracts.cases import MODEL_CONFIGS

BLOCK_SIZE = 16


def _loadable() -> dict[str, ModelConfig]:
    """Fixture configs the runtime loads (not Mixtral nor an AWQ checkpoint: the planner refuses those)."""
    out = {}
    for repo, config in MODEL_CONFIGS.items():
        with contextlib.suppress(ModelLoadError, UnsupportedModelError):
            out[repo] = ModelConfig.from_dict(config)
    return out


LOADABLE = _loadable()


def runtime_bytes_per_token(config: ModelConfig, kv_dtype: str) -> float:
    dtype = resolve_kv_cache_dtype(kv_dtype, torch.bfloat16)
    return kv_block_bytes(config, BLOCK_SIZE, dtype) / BLOCK_SIZE


def test_enough_real_shapes_are_compared() -> None:
    assert len(LOADABLE) >= 5, sorted(LOADABLE)


@pytest.mark.parametrize("repo", sorted(LOADABLE))
def test_both_config_readers_read_the_same_shape(repo: str) -> None:
    facts, config = facts_from_config(MODEL_CONFIGS[repo]), LOADABLE[repo]
    assert (facts.num_layers, facts.num_kv_heads, facts.head_dim) == (
        config.num_hidden_layers,
        config.num_key_value_heads,
        config.head_dim,
    )


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp16", "fp8"])
@pytest.mark.parametrize("repo", sorted(LOADABLE))
def test_kv_bytes_agree(repo: str, kv_dtype: str) -> None:
    """The runtime sizes its cache with the shared formula, 8-bit scale bytes included."""
    facts, config = facts_from_config(MODEL_CONFIGS[repo]), LOADABLE[repo]
    shared = kv_cache.kv_bytes_per_token(
        num_layers=config.num_hidden_layers,
        num_kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        kv_dtype=kv_dtype,
    )
    assert kv_bytes_per_token(facts, kv_dtype) == shared == runtime_bytes_per_token(config, kv_dtype)


@pytest.mark.parametrize("repo", sorted(MODEL_CONFIGS))
def test_sharded_kv_bytes_are_the_shared_formula(repo: str) -> None:
    facts = facts_from_config(MODEL_CONFIGS[repo])
    for kv_dtype in ("bf16", "fp8", "int8"):
        for tp in (1, 2, 4, 8):
            for pp in (1, 2, 3):
                assert kv_bytes_per_token(facts, kv_dtype, tp, pp) == kv_cache.kv_bytes_per_token(
                    num_layers=facts.num_layers,
                    num_kv_heads=facts.num_kv_heads,
                    head_dim=facts.head_dim,
                    kv_dtype=kv_dtype,
                    tensor_parallel=tp,
                    pipeline_parallel=pp,
                )
