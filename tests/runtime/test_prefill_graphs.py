"""Prefill graphs (engine/prefill_graphs.py): a lone prompt's prefill replayed from a graph of a bucketed
token count, its padding rows a sequence of their own that stores nothing.

On CPU the graphs are the eager stand-ins (capture(eager=True)): the same static buffers, padding layout
and bucket choice as on the GPU, with the forward run on replay. Their logits and the KV cache they leave
must equal the eager path's; the test marked `gpu` captures real graphs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.engine.batch import SeqChunk, StepBatch
from kvpilot.runtime.engine.engine_args import EngineArgs, EngineArgsError
from kvpilot.runtime.engine.model_inputs import prepare_inputs, prepare_prefill_graph_inputs
from kvpilot.runtime.engine.model_runner import ModelRunner
from kvpilot.runtime.engine.prefill_graphs import lone_prefill_tokens, prefill_buckets

BLOCK = 16
CPU = torch.device("cpu")


def prompt(n: int, seq: int = 0, start: int = 0, first_block: int = 0, sample: bool = True) -> SeqChunk:
    blocks = list(range(first_block, first_block + -(-(start + n) // BLOCK)))
    return SeqChunk(seq, [(7 * i + 3) % 97 + 1 for i in range(n)], start, blocks, sample)


def test_a_chunk_sits_after_a_padding_sequence_that_stores_nothing() -> None:
    chunk = SeqChunk(0, [4, 11, 18, 25, 32], 0, [3, 4], True)
    inputs = prepare_prefill_graph_inputs(chunk, 8, 4, CPU)  # bucket 8, block size 4
    assert inputs.input_ids.tolist() == [0, 0, 0, *chunk.token_ids]
    assert inputs.positions.tolist() == [0, 1, 2, 0, 1, 2, 3, 4]  # the chunk keeps its own positions
    assert inputs.meta.slot_mapping.tolist() == [-1, -1, -1, 12, 13, 14, 15, 16]
    assert inputs.meta.cu_seqlens_q.tolist() == [0, 3, 8]
    assert inputs.meta.context_lens.tolist() == [3, 5]  # the padding attends only to itself
    assert inputs.meta.block_tables.tolist() == [[0, 0], [3, 4]]
    assert inputs.sample_indices.tolist() == [7]
    plain = prepare_inputs(StepBatch([chunk]), 4, CPU)
    assert inputs.meta.slot_mapping[3:].tolist() == plain.meta.slot_mapping.tolist()
    with pytest.raises(ValueError, match="cannot run"):
        prepare_prefill_graph_inputs(SeqChunk(0, list(range(9)), 0, [1, 2, 3], True), 8, 4, CPU)


def test_which_batches_a_prefill_graph_runs() -> None:
    assert prefill_buckets(1000) == [256, 512, 768]
    assert lone_prefill_tokens(StepBatch([prompt(300)])) == 300
    assert lone_prefill_tokens(StepBatch([prompt(300), prompt(20, seq=1)])) is None  # two prompts
    assert lone_prefill_tokens(StepBatch([prompt(300, start=32)])) is None  # a cached prefix
    assert lone_prefill_tokens(StepBatch([prompt(300, sample=False)])) is None  # a chunk of a longer prompt


@pytest.fixture(scope="module")
def ckpt(tiny_checkpoint_factory: Callable[..., Path]) -> Path:
    return tiny_checkpoint_factory("qwen3", seed=3)


def runner(ckpt: Path, **overrides: object) -> ModelRunner:
    args = EngineArgs(model=str(ckpt), block_size=BLOCK, num_kv_blocks=64, max_model_len=1024, **overrides)
    return ModelRunner(args)


def test_graph_prefill_matches_the_eager_one_and_leaves_the_same_cache(ckpt: Path) -> None:
    graphed, eager = runner(ckpt), runner(ckpt)
    graphed._capture_prefill_graphs(EngineArgs(model=str(ckpt)), eager=True)
    assert graphed.prefill_graphs is not None and graphed.prefill_graphs.buckets == [256, 512, 768, 1024]
    batch = StepBatch([prompt(300, first_block=5)])
    assert graphed.prefill_graphs.bucket(batch) == 512
    got, want = graphed.execute(batch), eager.execute(batch)
    assert got.shape == want.shape == (1, graphed.model_config.vocab_size)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for mine, theirs in zip(graphed.kv_caches, eager.kv_caches, strict=True):
        torch.testing.assert_close(mine.k, theirs.k, atol=1e-5, rtol=1e-5)  # padding stored nothing
        torch.testing.assert_close(mine.v, theirs.v, atol=1e-5, rtol=1e-5)
    decode = StepBatch([SeqChunk(0, [11], 300, list(range(5, 5 + 19)), True)])
    torch.testing.assert_close(graphed.execute(decode), eager.execute(decode), atol=1e-4, rtol=1e-4)


def test_an_exact_bucket_needs_no_padding_and_other_batches_stay_eager(ckpt: Path) -> None:
    graphed, eager = runner(ckpt), runner(ckpt)
    graphed._capture_prefill_graphs(EngineArgs(model=str(ckpt)), eager=True)
    exact = StepBatch([prompt(256)])
    torch.testing.assert_close(graphed.execute(exact), eager.execute(exact), atol=1e-4, rtol=1e-4)
    two = StepBatch([prompt(40, seq=1, first_block=20), prompt(30, seq=2, first_block=30)])
    assert graphed.prefill_graphs is not None and graphed.prefill_graphs.bucket(two) is None
    torch.testing.assert_close(graphed.execute(two), eager.execute(two), atol=1e-4, rtol=1e-4)


def test_the_setting_is_checked_and_zero_turns_the_graphs_off(ckpt: Path) -> None:
    with pytest.raises(EngineArgsError, match="prefill-graph-max-tokens"):
        EngineArgs(model=str(ckpt), prefill_graph_max_tokens=-1).validate()
    off = runner(ckpt)
    off._capture_prefill_graphs(EngineArgs(model=str(ckpt), prefill_graph_max_tokens=0), eager=True)
    assert off.prefill_graphs is None
    small = runner(ckpt)  # the step budget caps the buckets
    small._capture_prefill_graphs(EngineArgs(model=str(ckpt), max_num_batched_tokens=600), eager=True)
    assert small.prefill_graphs is not None and small.prefill_graphs.buckets == [256, 512]


@pytest.mark.gpu
def test_captured_prefill_graphs_match_eager_prefill_on_the_gpu(ckpt: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    graphed = runner(ckpt, device="cuda", dtype="bfloat16")
    eager = runner(ckpt, device="cuda", dtype="bfloat16", prefill_graph_max_tokens=0)
    assert graphed.prefill_graphs is not None and eager.prefill_graphs is None
    for n in (300, 512, 1000):
        batch = StepBatch([prompt(n, first_block=1)])
        got, want = graphed.execute(batch).float(), eager.execute(batch).float()
        torch.testing.assert_close(got, want, atol=0.05, rtol=0.05)
        assert got.argmax() == want.argmax()
