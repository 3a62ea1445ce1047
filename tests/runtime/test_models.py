"""Our Llama-family model through the ModelRunner equals transformers on the same checkpoint (float32).

Tolerance: logits within ATOL = 1e-4 absolute (observed ~5e-6; logits have std ~1.6).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.engine.batch import SeqChunk, StepBatch
from kvpilot.runtime.engine.engine_args import EngineArgs
from kvpilot.runtime.engine.model_runner import ModelRunner

ATOL = 1e-4

# (family, overrides): every family, plus MHA/GQA/MQA and tied/untied/bias variants.
VARIANTS = [
    ("llama2", {}),  # MHA, untied
    ("llama2", {"attention_bias": True, "tie_word_embeddings": True}),  # q/k/v/o bias, tied
    ("llama3", {}),  # GQA, llama3 rope scaling, untied
    ("llama3", {"num_key_value_heads": 1}),  # MQA
    ("qwen2", {}),  # q/k/v bias, GQA, tied
    ("qwen2", {"num_key_value_heads": 1, "tie_word_embeddings": False}),
    ("qwen3", {}),  # q/k norm, head_dim * heads != hidden, tied
    ("qwen3", {"num_key_value_heads": 4, "tie_word_embeddings": False, "num_hidden_layers": 3}),
]
VARIANT_IDS = [
    f"{family}-{'-'.join(f'{k}={v}' for k, v in o.items()) or 'default'}" for family, o in VARIANTS
]


def prompts(vocab_size: int, lengths: tuple[int, ...] = (1, 6, 17, 40), seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(n)] for n in lengths]


class PagedSequence:
    """Test-side bookkeeping for one sequence: allocates blocks from a shared pool as it grows."""

    def __init__(self, seq_id: int, tokens: list[int], pool: list[int], block_size: int) -> None:
        self.seq_id, self.tokens, self.pool, self.block_size = seq_id, list(tokens), pool, block_size
        self.cached, self.blocks = 0, []

    def chunk(self, num_tokens: int, sample: bool) -> SeqChunk:
        end = self.cached + num_tokens
        while len(self.blocks) * self.block_size < end:
            self.blocks.append(self.pool.pop())
        chunk = SeqChunk(self.seq_id, self.tokens[self.cached : end], self.cached, list(self.blocks), sample)
        self.cached = end
        return chunk


def scrambled_pool(num_blocks: int, seed: int = 1) -> list[int]:
    pool = list(range(num_blocks))
    random.Random(seed).shuffle(pool)
    return pool


@pytest.mark.parametrize(("family", "overrides"), VARIANTS, ids=VARIANT_IDS)
def test_prefill_logits_match_transformers(
    family: str, overrides: dict, tiny_checkpoint_factory: Callable, hf_logits: Callable
) -> None:
    path = tiny_checkpoint_factory(family, **overrides)
    runner = ModelRunner(EngineArgs(model=str(path), block_size=8, num_kv_blocks=32))
    seqs = prompts(runner.model_config.vocab_size)
    pool = scrambled_pool(32)
    batch = StepBatch([PagedSequence(i, s, pool, 8).chunk(len(s), True) for i, s in enumerate(seqs)])
    logits = runner.execute(batch)
    assert logits.shape == (len(seqs), runner.model_config.vocab_size) and logits.dtype == torch.float32
    for row, seq in zip(logits, seqs, strict=True):
        torch.testing.assert_close(row, hf_logits(path, seq)[-1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", ["llama2", "llama3", "qwen2", "qwen3"])
def test_chunked_prefill_and_decode_match_transformers(
    family: str, tiny_checkpoint_factory: Callable, hf_logits: Callable
) -> None:
    """Two sequences share steps: prefill chunks crossing block boundaries (block_size 4), a decode next to
    a prefill chunk, then greedy decodes. Every returned row equals transformers at that position."""
    path = tiny_checkpoint_factory(family)
    runner = ModelRunner(EngineArgs(model=str(path), block_size=4, num_kv_blocks=40))
    long_prompt, short_prompt = prompts(runner.model_config.vocab_size, (30, 11), seed=3)
    pool = scrambled_pool(40, seed=7)
    a, b = PagedSequence(0, long_prompt, pool, 4), PagedSequence(1, short_prompt, pool, 4)
    got: dict[int, list[tuple[int, torch.Tensor]]] = {0: [], 1: []}  # seq -> (position, logits)

    def step(*chunks: SeqChunk) -> None:
        logits = iter(runner.execute(StepBatch(list(chunks))))
        for chunk in chunks:
            if chunk.sample:
                row = next(logits)
                got[chunk.seq_id].append((chunk.context_len - 1, row))
                seq = a if chunk.seq_id == 0 else b
                seq.tokens.append(int(row.argmax()))

    step(a.chunk(5, False), b.chunk(3, False))
    step(a.chunk(9, False), b.chunk(8, True))  # b's prefill ends inside a block
    step(a.chunk(16, True), b.chunk(1, True))  # a prefill chunk next to b's first decode
    for _ in range(6):
        step(b.chunk(1, True), a.chunk(1, True))
    for seq in (a, b):
        reference = hf_logits(path, seq.tokens[:-1])
        assert len(got[seq.seq_id]) == (7 if seq is a else 8)
        for position, row in got[seq.seq_id]:
            torch.testing.assert_close(row, reference[position], atol=ATOL, rtol=0)


def test_sharded_checkpoint_equals_single_file(tiny_checkpoint_factory: Callable) -> None:
    single = ModelRunner(
        EngineArgs(model=str(tiny_checkpoint_factory("qwen2", seed=5)), block_size=8, num_kv_blocks=8)
    )
    sharded_dir = tiny_checkpoint_factory("qwen2", seed=5, shards=3)
    assert len(list(sharded_dir.glob("model-*-of-00003.safetensors"))) == 3
    sharded = ModelRunner(EngineArgs(model=str(sharded_dir), block_size=8, num_kv_blocks=8))
    for (name, p1), (_, p2) in zip(
        single.model.named_parameters(), sharded.model.named_parameters(), strict=True
    ):
        assert torch.equal(p1, p2), name
    batch = StepBatch([SeqChunk(0, [5, 9, 200, 3, 17], 0, [2], True)])
    assert torch.equal(single.execute(batch), sharded.execute(batch))


def test_bfloat16_on_cpu_is_close_to_float32(qwen3_checkpoint: Path) -> None:
    batch = StepBatch([SeqChunk(0, list(range(10, 30)), 0, [0, 1, 2], True)])
    exact = ModelRunner(EngineArgs(model=str(qwen3_checkpoint), block_size=8, num_kv_blocks=4)).execute(batch)
    runner = ModelRunner(
        EngineArgs(model=str(qwen3_checkpoint), block_size=8, num_kv_blocks=4, dtype="bfloat16")
    )
    assert runner.model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert runner.kv_caches[0][0].dtype == torch.bfloat16
    logits = runner.execute(batch)
    assert logits.dtype == torch.bfloat16  # the LM head's own dtype: consumers widen what they need
    torch.testing.assert_close(logits.float(), exact, atol=0.15, rtol=0)
    assert not torch.equal(logits, exact)  # it really ran in bf16


def test_weights_stored_in_bfloat16_load_into_float32(
    tiny_checkpoint_factory: Callable, hf_logits: Callable
) -> None:
    path = tiny_checkpoint_factory("llama3", torch_dtype="bfloat16")
    runner = ModelRunner(EngineArgs(model=str(path), block_size=8, num_kv_blocks=4))
    assert runner.dtype == torch.float32
    tokens = list(range(40, 52))
    logits = runner.execute(StepBatch([SeqChunk(0, tokens, 0, [3, 1], True)]))
    torch.testing.assert_close(logits[0], hf_logits(path, tokens)[-1], atol=ATOL, rtol=0)
