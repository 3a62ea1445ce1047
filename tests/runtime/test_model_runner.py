"""ModelRunner plumbing: flattened inputs, KV cache writes, sizing, options and their errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.engine.batch import SeqChunk, StepBatch
from kvpilot.runtime.engine.engine_args import EngineArgs, EngineArgsError
from kvpilot.runtime.engine.model_runner import (
    ModelRunner,
    cpu_num_kv_blocks,
    kv_block_bytes,
    prepare_inputs,
)
from kvpilot.runtime.errors import ModelLoadError

CPU = torch.device("cpu")


def test_prepare_inputs_flattens_prefill_chunks_and_decodes() -> None:
    batch = StepBatch(
        [
            SeqChunk(seq_id=0, token_ids=[11, 12, 13], start_pos=2, block_table=[7, 3], sample=True),
            SeqChunk(seq_id=1, token_ids=[21], start_pos=9, block_table=[0, 5, 6], sample=True),
            SeqChunk(seq_id=2, token_ids=[31, 32], start_pos=0, block_table=[1], sample=False),
        ]
    )
    inputs = prepare_inputs(batch, block_size=4, device=CPU)
    assert inputs.input_ids.tolist() == [11, 12, 13, 21, 31, 32]
    assert inputs.positions.tolist() == [2, 3, 4, 9, 0, 1]
    # slot = block_table[pos // 4] * 4 + pos % 4
    assert inputs.meta.slot_mapping.tolist() == [7 * 4 + 2, 7 * 4 + 3, 3 * 4 + 0, 6 * 4 + 1, 1 * 4, 1 * 4 + 1]
    assert inputs.meta.cu_seqlens_q.tolist() == [0, 3, 4, 6]
    assert inputs.meta.context_lens.tolist() == [5, 10, 2]
    assert inputs.meta.block_tables.tolist() == [[7, 3, 0], [0, 5, 6], [1, 0, 0]]
    assert (inputs.meta.max_q_len, inputs.meta.max_context_len) == (3, 10)
    assert inputs.sample_indices.tolist() == [2, 3]  # last token of each sampled chunk
    assert inputs.meta.slot_mapping.dtype == torch.int64 and inputs.meta.block_tables.dtype == torch.int32


def test_prepare_inputs_rejects_a_block_table_too_short() -> None:
    batch = StepBatch([SeqChunk(seq_id=4, token_ids=[1, 2], start_pos=7, block_table=[0, 1], sample=True)])
    with pytest.raises(ValueError, match="sequence 4: block table of 2 blocks cannot hold 9 tokens"):
        prepare_inputs(batch, block_size=4, device=CPU)


def test_execute_writes_kv_at_the_slots_and_returns_only_sampled_rows(qwen3_checkpoint: Path) -> None:
    runner = ModelRunner(EngineArgs(model=str(qwen3_checkpoint), block_size=4, num_kv_blocks=6))
    vocab = runner.model_config.vocab_size
    assert runner.execute(StepBatch([])).shape == (0, vocab)
    logits = runner.execute(StepBatch([SeqChunk(0, [5, 6, 7, 8, 9], 0, [4, 1], False)]))
    assert logits.shape == (0, vocab)
    for k_cache, v_cache, *_ in runner.kv_caches:
        for cache in (k_cache, v_cache):
            written = cache.abs().sum(dim=(2, 3)) != 0  # [blocks, block_size]
            expected = torch.zeros_like(written)
            expected[4, :] = True
            expected[1, 0] = True
            assert torch.equal(written, expected)
    both = runner.execute(StepBatch([SeqChunk(0, [10], 5, [4, 1], True), SeqChunk(1, [3, 4], 0, [2], True)]))
    assert both.shape == (2, vocab) and both.dtype == torch.float32 and torch.isfinite(both).all()


def test_kv_cache_layout_and_default_size(llama3_checkpoint: Path) -> None:
    runner = ModelRunner(EngineArgs(model=str(llama3_checkpoint), block_size=8, max_model_len=100))
    cfg = runner.model_config
    assert runner.max_model_len == 100 and runner.block_size == 8
    assert runner.num_kv_blocks == 8 * 13  # CPU default: 8 sequences of max_model_len
    assert len(runner.kv_caches) == cfg.num_hidden_layers
    assert runner.kv_caches[0][0].shape == (runner.num_kv_blocks, 8, cfg.num_key_value_heads, cfg.head_dim)
    assert runner.kv_caches[0][1].dtype == torch.float32
    assert ModelRunner(EngineArgs(model=str(llama3_checkpoint))).max_model_len == cfg.max_position_embeddings


def test_cpu_default_is_capped_by_bytes_but_holds_one_sequence() -> None:
    assert cpu_num_kv_blocks(block_bytes=1 << 20, max_model_len=4096, block_size=16) == 256 * 4  # 1 GiB cap
    assert cpu_num_kv_blocks(block_bytes=1 << 30, max_model_len=4096, block_size=16) == 256  # one sequence
    assert cpu_num_kv_blocks(block_bytes=1024, max_model_len=64, block_size=16) == 8 * 4


def test_kv_cache_dtypes(qwen2_checkpoint: Path) -> None:
    runner = ModelRunner(
        EngineArgs(model=str(qwen2_checkpoint), block_size=4, num_kv_blocks=4, kv_cache_dtype="bfloat16")
    )
    assert runner.kv_caches[0][0].dtype == torch.bfloat16
    assert kv_block_bytes(runner.model_config, 4, torch.bfloat16) == 2 * 2 * 4 * 2 * 16 * 2
    logits = runner.execute(StepBatch([SeqChunk(0, [1, 2, 3], 0, [0], True)]))
    assert torch.isfinite(logits).all()
    eight_bit = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "int8": torch.int8}
    for name, dtype in eight_bit.items():
        q8 = ModelRunner(
            EngineArgs(model=str(qwen2_checkpoint), block_size=4, num_kv_blocks=4, kv_cache_dtype=name)
        )
        k, v, k_scale, v_scale = q8.kv_caches[0]
        assert k.dtype == v.dtype == dtype and k_scale.dtype == v_scale.dtype == torch.float32
        assert k_scale.shape == k.shape[:3]
        torch.testing.assert_close(
            q8.execute(StepBatch([SeqChunk(0, [1, 2, 3], 0, [0], True)])), logits, atol=0.5, rtol=0
        )


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max_model_len": 5000}, ModelLoadError, "max_model_len 5000 exceeds .* 1024"),
        ({"device": "cuda"}, ModelLoadError, "no CUDA GPU"),
        ({"device": "tpu"}, EngineArgsError, "--device 'tpu' is not one of"),
        ({"dtype": "float64"}, EngineArgsError, "--dtype 'float64' is not one of"),
        ({"kv_cache_dtype": "fp4"}, EngineArgsError, "--kv-cache-dtype 'fp4' is not one of"),
        ({"kernel_backend": "cutlass"}, EngineArgsError, "--kernel-backend 'cutlass' is not one of"),
        ({"load_format": "gguf"}, EngineArgsError, "--load-format 'gguf' is not one of"),
        ({"num_kv_blocks": 0}, EngineArgsError, "--num-kv-blocks must be positive"),
        ({"block_size": 0}, EngineArgsError, "--block-size must be positive"),
    ],
)
def test_bad_options(kwargs: dict, error: type, message: str, qwen3_checkpoint: Path) -> None:
    if kwargs.get("device") == "cuda" and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(error, match=message):
        ModelRunner(EngineArgs(model=str(qwen3_checkpoint), **kwargs))


def test_dummy_weights_need_no_weight_files(qwen3_checkpoint: Path, copy_checkpoint: Callable) -> None:
    path = copy_checkpoint(qwen3_checkpoint)
    (path / "model.safetensors").unlink()
    batch = StepBatch([SeqChunk(0, [1, 2, 3], 0, [0], True)])
    first = ModelRunner(EngineArgs(model=str(path), load_format="dummy", seed=3, num_kv_blocks=2)).execute(
        batch
    )
    again = ModelRunner(EngineArgs(model=str(path), load_format="dummy", seed=3, num_kv_blocks=2)).execute(
        batch
    )
    other = ModelRunner(EngineArgs(model=str(path), load_format="dummy", seed=4, num_kv_blocks=2)).execute(
        batch
    )
    assert torch.isfinite(first).all() and torch.equal(first, again) and not torch.equal(first, other)
    with pytest.raises(ModelLoadError, match="no weights"):
        ModelRunner(EngineArgs(model=str(path), num_kv_blocks=2))
