"""Verification steps through step graphs (engine/cuda_graphs.py StepGraphs with k + 1 query rows each).

On CPU the graphs are the eager stand-ins (capture(eager=True)): the same static buffers, front padding of
sequences with fewer drafts, bucket padding and sample-row selection as on the GPU, with the forward run
on replay. Their logits must equal the eager verification path's, and a whole engine speculating through
them must give exactly the greedy tokens of plain decoding. Tests marked `gpu` capture real CUDA graphs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.engine.batch import SeqChunk, StepBatch
from kvpilot.runtime.engine.cuda_graphs import StepGraphs, fits_verify_graph
from kvpilot.runtime.engine.engine_args import EngineArgs
from kvpilot.runtime.engine.model_inputs import prepare_inputs, prepare_padded_inputs
from kvpilot.runtime.engine.model_runner import ModelRunner
from kvpilot.runtime.llm import LLM
from kvpilot.runtime.sampling_params import SamplingParams

BLOCK = 4
K = 3  # drafts per sequence: graphs of K + 1 = 4 query rows per sequence
CPU = torch.device("cpu")


def chunk(seq: int, tokens: list[int], start: int, num_spec: int, blocks: list[int]) -> SeqChunk:
    return SeqChunk(seq, tokens, start, blocks, True, num_spec=num_spec)


def test_padded_inputs_front_pad_with_rows_that_store_nothing() -> None:
    # sequence 0: 1 token + 2 drafts at positions 9..11; sequence 1: a plain decode at position 5
    batch = StepBatch([chunk(0, [7, 8, 9], 9, 2, [3, 1, 4]), chunk(1, [5], 5, 0, [2, 6])])
    inputs = prepare_padded_inputs(batch, BLOCK, CPU, query_len=4)
    assert inputs.input_ids.tolist() == [0, 7, 8, 9, 0, 0, 0, 5]
    assert inputs.positions.tolist() == [8, 9, 10, 11, 2, 3, 4, 5]
    # slot = table[pos // 4] * 4 + pos % 4; padding rows -1
    assert inputs.meta.slot_mapping.tolist() == [-1, 17, 18, 19, -1, -1, -1, 25]
    assert inputs.meta.cu_seqlens_q.tolist() == [0, 4, 8]
    assert inputs.meta.context_lens.tolist() == [12, 6]  # unchanged: the real rows keep their causal limits
    assert inputs.meta.max_q_len == 4
    assert inputs.sample_indices.tolist() == [1, 2, 3, 7]  # the drafts' rows and the one before them


def test_padded_rows_see_what_the_unpadded_rows_see() -> None:
    batch = StepBatch([chunk(0, [7, 8], 6, 1, [0, 1]), chunk(1, [3, 4, 5, 6], 8, 3, [2, 3, 4])])
    plain, padded = prepare_inputs(batch, BLOCK, CPU), prepare_padded_inputs(batch, BLOCK, CPU, 4)
    keep = padded.meta.slot_mapping >= 0
    assert padded.input_ids[keep].tolist() == plain.input_ids.tolist()
    assert padded.positions[keep].tolist() == plain.positions.tolist()
    assert padded.meta.slot_mapping[keep].tolist() == plain.meta.slot_mapping.tolist()
    assert padded.input_ids[padded.sample_indices].tolist() == plain.input_ids[plain.sample_indices].tolist()


def test_which_batches_a_verify_graph_runs() -> None:
    verify = chunk(0, [1, 2, 3], 9, 2, [0, 1, 2])
    decode = chunk(1, [4], 9, 0, [3, 4, 5])
    assert fits_verify_graph(StepBatch([verify, decode]), 4)
    assert not fits_verify_graph(StepBatch([decode]), 4)  # no drafts: the decode graphs' job
    assert not fits_verify_graph(StepBatch([verify]), 2)  # more rows than the graph has
    assert not fits_verify_graph(StepBatch([verify, chunk(2, [1] * 6, 0, 0, [6, 7])]), 4)  # a prefill
    assert not fits_verify_graph(StepBatch([chunk(0, [1, 2], 1, 1, [0])]), 4)  # context 3 < 4 rows


def test_graph_buffers_pad_the_bucket_and_keep_cu_seqlens_fixed() -> None:
    seen = []

    def forward(ids: torch.Tensor, pos: torch.Tensor, meta: object) -> torch.Tensor:
        seen.append(meta)
        return ids.float()[:, None].repeat(1, 2)

    graphs = StepGraphs(
        forward, max_num_seqs=8, max_blocks_per_seq=4, block_size=BLOCK, device=CPU, query_len=4
    )
    graphs.capture(eager=True)
    assert graphs.bucket(3, 4) == 4 and graphs.bucket(9, 1) is None and graphs.bucket(1, 5) is None
    batch = StepBatch([chunk(s, [s + 1, s + 2], 10, 1, [s, 7, 8]) for s in range(3)])
    out = graphs.run(prepare_padded_inputs(batch, BLOCK, CPU, 4), 4)
    meta = seen[-1]
    assert out.shape == (12, 2) and out[:, 0].tolist() == [0, 0, 1, 2, 0, 0, 2, 3, 0, 0, 3, 4]
    assert meta.cu_seqlens_q.tolist() == [0, 4, 8, 12, 16] and meta.max_q_len == 4
    assert meta.context_lens.tolist() == [12, 12, 12, 4]  # the padding sequence sees positions 0..3
    assert meta.slot_mapping[12:].tolist() == [-1] * 4 and meta.block_tables[3].tolist() == [0] * 4


def _runner(path: Path) -> ModelRunner:
    return ModelRunner(
        EngineArgs(
            model=str(path),
            block_size=BLOCK,
            max_model_len=64,
            device="cpu",
            num_kv_blocks=32,
            max_num_seqs=8,
        )
    )


def _prefill(runner: ModelRunner, prompts: list[list[int]], tables: list[list[int]]) -> None:
    runner.execute(StepBatch([SeqChunk(i, p, 0, tables[i], True) for i, p in enumerate(prompts)]))


def test_verify_logits_through_graphs_equal_the_eager_path(qwen3_checkpoint: Path) -> None:
    eager, graphed = _runner(qwen3_checkpoint), _runner(qwen3_checkpoint)
    graphed.capture_verify_graphs(K, 8, eager=True)
    assert graphed.verify_graphs is not None and graphed.verify_graphs.query_len == K + 1
    prompts = [[5, 9, 11, 13, 17, 19, 23], [40, 41, 42, 43, 44], [60, 61, 62, 63, 64, 65, 66, 67, 68]]
    tables = [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9, 10]]
    for runner in (eager, graphed):
        _prefill(runner, prompts, tables)
    # 3 drafts, 1 draft, none: front padding of 0, 2 and 3 rows; 3 sequences in the bucket of 4
    drafts = [[30, 31, 32], [33], []]
    batch = StepBatch(
        [
            chunk(i, [70 + i, *d], len(p), len(d), tables[i])
            for i, (p, d) in enumerate(zip(prompts, drafts, strict=True))
        ]
    )
    want, got = eager.execute(batch), graphed.execute(batch)
    assert 4 in graphed.verify_graphs.outputs  # the bucket-4 stand-in was replayed
    assert got.shape == want.shape == (batch.num_sample_rows, graphed.model_config.vocab_size)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # and the KV the graph stored is the eager path's: a decode after it reads the same cache
    follow = StepBatch(
        [
            SeqChunk(i, [90], len(p) + 1 + len(d), tables[i], True)
            for i, (p, d) in enumerate(zip(prompts, drafts, strict=True))
        ]
    )
    torch.testing.assert_close(graphed.execute(follow), eager.execute(follow), rtol=1e-4, atol=1e-4)


NGRAM = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_engine_through_verify_graphs_gives_the_plain_greedy_tokens(
    family: str, tiny_checkpoint_factory: Callable[..., Path]
) -> None:
    path = tiny_checkpoint_factory(family)
    prompts = ["the cat sat on the mat. the cat sat on the mat. the cat sat on", "a b c a b c a b", "Hi"]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    base = {"block_size": BLOCK, "max_model_len": 256, "device": "cpu"}  # the stand-ins; gpu tests below
    plain = LLM(path, **base).generate(prompts, params)
    llm = LLM(path, **base, speculative_config=NGRAM)
    llm.engine.runner.capture_verify_graphs(3, 4, eager=True)
    spec = llm.generate(prompts, params)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert llm.engine.runner.verify_graphs.outputs  # verification ran through the graphs
    stats = llm.engine.stats().spec_decode
    assert stats is not None and stats.num_accepted_tokens > 0


# ---------------------------------------------------------------- GPU: real CUDA graphs


def _cuda_runner(path: Path, eager: bool) -> ModelRunner:
    args = EngineArgs(
        model=str(path),
        block_size=16,
        max_model_len=512,
        device="cuda",
        dtype="bfloat16",
        num_kv_blocks=64,
        load_format="dummy",
        seed=3,
        max_num_seqs=8,
        enforce_eager=eager,
    )
    return ModelRunner(args)


@pytest.mark.gpu
def test_gpu_verify_graphs_match_the_eager_verify_path(tmp_path: Path) -> None:
    """Qwen3-0.6B shape, random bf16 weights: verification steps (k = 4, uneven drafts, a bucket with
    padding sequences) replayed from CUDA graphs give the eager path's logits and greedy choices, and
    store the same KV (the decode step after them agrees too)."""
    from kvpilot.runtime.bench_workloads import write_model_dir

    path = write_model_dir(tmp_path, "qwen3-0.6b")
    eager, graphed = _cuda_runner(path, True), _cuda_runner(path, False)
    graphed.capture_verify_graphs(4, 8)
    assert graphed.verify_graphs is not None and graphed.verify_graphs.query_len == 5
    gen = torch.Generator().manual_seed(0)
    lens = [37, 100, 5]
    prompts = [torch.randint(1000, 100000, (n,), generator=gen).tolist() for n in lens]
    tables = [list(range(10 * i, 10 * i + 10))[::-1] for i in range(3)]
    for runner in (eager, graphed):
        _prefill(runner, prompts, tables)
    drafts = [[11, 12, 13, 14], [15, 16], []]
    batch = StepBatch([chunk(i, [7, *d], lens[i], len(d), tables[i]) for i, d in enumerate(drafts)])
    want, got = eager.execute(batch).float(), graphed.execute(batch).float()
    diff = (want - got).abs().max().item()
    assert diff < 0.05, diff
    top2 = want.topk(2, dim=-1).values
    near_tie = (top2[:, 0] - top2[:, 1]) <= 2 * diff
    assert ((want.argmax(-1) == got.argmax(-1)) | near_tie).all()
    follow = StepBatch(
        [SeqChunk(i, [9], lens[i] + 1 + len(d), tables[i], True) for i, d in enumerate(drafts)]
    )
    assert (eager.execute(follow).float() - graphed.execute(follow).float()).abs().max().item() < 0.05
