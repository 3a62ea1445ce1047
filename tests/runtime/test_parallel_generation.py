"""Tensor and pipeline parallel on CPU (gloo, spawned worker processes) produce exactly the greedy tokens,
and logprobs within 1e-4, of one process, on tiny checkpoints of every family: GQA with fewer KV heads
than ranks, tied embeddings, a vocabulary no rank count divides, q/k/v bias and q/k norm, with prefix
caching, preemption, chunked prefill and overlapped (asynchronous) steps in the run. Pipeline parallel
splits the prefill-heavy steps into micro-batches (the stages overlap), with the same results."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kvpilot.runtime.distributed.executor import StepBroadcaster
from kvpilot.runtime.fixtures.checkpoint import make_tiny_checkpoint

from tests.runtime.parallel_support import Run, assert_same, engine_args, generate, reference, spawned_group

ODD_VOCAB = 1027  # divisible by neither 2 nor 4: the last vocab block is padded
CHECKPOINTS = {
    # name: (family, config.json overrides)
    "llama2-mha": ("llama2", {}),
    "llama3-kv1": ("llama3", {"num_key_value_heads": 1, "num_hidden_layers": 3}),  # fewer KV heads than ranks
    "qwen2-bias-tied": ("qwen2", {"vocab_size": ODD_VOCAB}),
    "qwen3-qknorm-tied": ("qwen3", {"vocab_size": ODD_VOCAB}),
}
TP4_CHECKPOINTS = {
    "llama3-kv4": ("llama3", {"num_key_value_heads": 4, "vocab_size": ODD_VOCAB}),
    "qwen3-kv8": ("qwen3", {"num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 8}),
    "qwen2-kv2": ("qwen2", {}),  # 2 KV heads on 4 ranks: each replicated twice
}


def _make(root: Path, table: dict[str, tuple[str, dict]]) -> dict[str, Path]:
    return {
        name: make_tiny_checkpoint(root / name, family, seed=3, **overrides)
        for name, (family, overrides) in table.items()
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("parallel")
    return _make(root, CHECKPOINTS) | _make(root, TP4_CHECKPOINTS)


@pytest.fixture(scope="module")
def references(checkpoints: dict[str, Path]) -> dict[str, Run]:
    return {name: reference(path) for name, path in checkpoints.items()}


@pytest.fixture(scope="module", params=[(2, 1), (1, 2), (4, 1), (2, 2)], ids=["tp2", "pp2", "tp4", "tp2pp2"])
def group(request: pytest.FixtureRequest, checkpoints: dict[str, Path]) -> Iterator[StepBroadcaster]:
    tp, pp = request.param
    yield from spawned_group(next(iter(checkpoints.values())), tp, pp)


def _check(group: StepBroadcaster, path: Path, ref: Run) -> None:
    rank = group.comm.rank
    group.load(engine_args(path, rank.tp, rank.pp).to_dict())
    assert_same(generate(group, path), ref)
    if rank.pp > 1:  # the stages ran micro-batched steps (the prefill-heavy ones), and whole ones
        stage = group.pipeline
        assert 0 < stage.split_steps < stage.steps
        assert stage.micro_batches >= 2 * stage.split_steps


@pytest.mark.parametrize("group", [(2, 1), (1, 2)], indirect=True, ids=["tp2", "pp2"])
def test_two_ranks_match_one(
    group: StepBroadcaster, checkpoints: dict[str, Path], references: dict[str, Run]
) -> None:
    for name in CHECKPOINTS:
        _check(group, checkpoints[name], references[name])


@pytest.mark.parametrize("group", [(4, 1), (2, 2)], indirect=True, ids=["tp4", "tp2pp2"])
def test_four_ranks_match_one(
    group: StepBroadcaster, checkpoints: dict[str, Path], references: dict[str, Run]
) -> None:
    for name in TP4_CHECKPOINTS:
        _check(group, checkpoints[name], references[name])
