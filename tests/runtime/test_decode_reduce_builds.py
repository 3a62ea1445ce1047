"""The split-KV reduce kernel compiles one build per BLOCK_S (decode_plan.reduce_block_s). Mixed steps run
decode eagerly with plans of their own, so every BLOCK_S such a plan can need must be one the CUDA-graph
capture already compiled: else the kernel compiles in the middle of serving and stalls every request
(tests/runtime/test_no_recompile_gpu.py saw it with an 8-bit cache: 16 splits of the Triton 8-bit tile).
Pure: the plans of every batch size and block-table width, against those of the captured graphs."""

from __future__ import annotations

import pytest
import torch
from kvpilot.runtime.engine.cuda_graphs import graph_batch_sizes
from kvpilot.runtime.engine.model_runner import GRAPH_MAX_CONTEXT
from kvpilot.runtime.kernels.decode_plan import (
    EIGHT_BIT_DECODE,
    INT8_DECODE,
    REDUCE_NARROW,
    REDUCE_WIDE,
    DecodeConfig,
    default_decode_config,
    plan_decode,
    plan_mma,
    reduce_block_s,
)

SMS, PAGE, MAX_NUM_SEQS = 132, 16, 16
CONFIGS = {"e4m3": EIGHT_BIT_DECODE, "int8": INT8_DECODE, "bf16": default_decode_config(torch.bfloat16)}


def reduce_build(config: DecodeConfig, num_seqs: int, num_kv_heads: int, width: int) -> int | None:
    """The reduce's BLOCK_S for a decode of num_seqs over a block table of width pages (None: no split),
    with the path the decode takes (kv8_decode.cu's plans for batches it runs, on CUDA)."""
    mma = config.mma if config.mma is not None and config.mma.runs(num_seqs, num_kv_heads) else None
    context = width * PAGE
    plan = (
        plan_decode(num_seqs, num_kv_heads, context, SMS, config)
        if mma is None
        else plan_mma(num_seqs, num_kv_heads, context, SMS, mma)
    )
    return reduce_block_s(plan.num_splits) if plan.num_splits > 1 else None


@pytest.mark.parametrize("cache", list(CONFIGS))
@pytest.mark.parametrize("num_kv_heads", [8, 2])
@pytest.mark.parametrize("max_model_len", [2048, 4096, 32768])
def test_the_captured_graphs_compile_every_reduce_an_eager_step_needs(
    cache: str, num_kv_heads: int, max_model_len: int
) -> None:
    config, widest = CONFIGS[cache], max_model_len // PAGE
    graph_width = min(max_model_len, GRAPH_MAX_CONTEXT) // PAGE
    captured = {reduce_build(config, n, num_kv_heads, graph_width) for n in graph_batch_sizes(MAX_NUM_SEQS)}
    widths = [*range(1, widest + 1, 5), widest]
    eager = {reduce_build(config, n, num_kv_heads, w) for n in range(1, MAX_NUM_SEQS + 1) for w in widths}
    assert eager - {None} <= captured - {None}


def test_two_builds_serve_every_split_count() -> None:
    assert {reduce_block_s(s) for s in range(2, 600)} == {REDUCE_NARROW, REDUCE_WIDE}
    assert reduce_block_s(16) == REDUCE_NARROW and reduce_block_s(17) == REDUCE_WIDE
