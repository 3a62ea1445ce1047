"""KV-cache sizing arithmetic and CUDA-graph buckets (pure parts of the GPU path)."""

from __future__ import annotations

import pytest
from kvpilot.runtime.engine.cuda_graphs import graph_batch_sizes
from kvpilot.runtime.engine.memory import MemoryProfile, kv_cache_blocks
from kvpilot.runtime.errors import ModelLoadError

GiB = 1 << 30


def test_cache_gets_what_is_left_under_the_utilization_after_the_peak_step() -> None:
    profile = MemoryProfile(total_bytes=140 * GiB, peak_torch_bytes=20 * GiB, non_torch_bytes=1 * GiB)
    blocks = kv_cache_blocks(
        profile,
        gpu_memory_utilization=0.9,
        block_bytes=2 * 1024 * 1024,
        blocks_per_seq=256,
        max_model_len=4096,
    )
    assert blocks == (int(140 * GiB * 0.9) - 21 * GiB) // (2 * 1024 * 1024)


def test_too_little_memory_names_the_numbers() -> None:
    profile = MemoryProfile(total_bytes=24 * GiB, peak_torch_bytes=20 * GiB, non_torch_bytes=1 * GiB)
    with pytest.raises(ModelLoadError, match=r"0\.60 GiB left of 24\.0 GiB.*max_model_len=32768 needs 4\.00"):
        kv_cache_blocks(
            profile,
            gpu_memory_utilization=0.9,
            block_bytes=2 * 1024 * 1024,
            blocks_per_seq=2048,
            max_model_len=32768,
        )


@pytest.mark.parametrize(
    ("max_seqs", "expected"),
    [
        (1, [1]),
        (3, [1, 2, 3]),
        (8, [1, 2, 4, 8]),
        (20, [1, 2, 4, 8, 16, 20]),
        (256, [1, 2, 4, *range(8, 257, 8)]),
    ],
)
def test_graph_buckets_cover_every_batch_size_up_to_max(max_seqs: int, expected: list[int]) -> None:
    sizes = graph_batch_sizes(max_seqs)
    assert sizes == expected
    assert all(any(s >= n for s in sizes) for n in range(1, max_seqs + 1))
