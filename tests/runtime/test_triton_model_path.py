"""The whole model on the Triton backend equals the torch-reference backend.

Without CUDA the kernels run under TRITON_INTERPRET=1 (set before triton is imported); the model is tiny so
the interpreter stays fast. On the GPU machine the same test runs the compiled kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()

from kvpilot.runtime.engine.batch import SeqChunk, StepBatch  # noqa: E402
from kvpilot.runtime.engine.engine_args import EngineArgs  # noqa: E402
from kvpilot.runtime.engine.model_runner import ModelRunner  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"
TOL = {"atol": 1e-4, "rtol": 1e-4} if INTERPRET else {"atol": 3e-2, "rtol": 3e-2}


def _steps() -> list[StepBatch]:
    """A prefill chunk beside a whole prompt, then a mixed step (decode + the rest of the chunked prompt),
    then a decode-only step: both attention kernels and every block-boundary case at block size 4."""
    a = [5, 9, 17, 33, 2, 8, 40, 41, 42]  # 9 tokens: blocks 3, 0, 6
    b = [7, 7, 100, 250, 3]
    return [
        StepBatch([SeqChunk(0, a[:6], 0, [3, 0], False), SeqChunk(1, b, 0, [1, 2], True)]),
        StepBatch([SeqChunk(0, a[6:], 6, [3, 0, 6], True), SeqChunk(1, [77], 5, [1, 2], True)]),
        StepBatch([SeqChunk(0, [12], 9, [3, 0, 6], True), SeqChunk(1, [5], 6, [1, 2], True)]),
    ]


@pytest.mark.parametrize("family", ["qwen3", "llama3", "qwen2"])
def test_triton_backend_logits_equal_torch_backend(
    family: str, tiny_checkpoint_factory: Callable[..., Path]
) -> None:
    ckpt = tiny_checkpoint_factory(family, num_key_value_heads=2)
    runners = {
        b: ModelRunner(
            EngineArgs(
                model=str(ckpt),
                block_size=4,
                num_kv_blocks=8,
                device=DEVICE,
                dtype="float32",
                kernel_backend=b,
            )
        )
        for b in ("torch", "triton")
    }
    for step in _steps():
        ref = runners["torch"].execute(step)
        got = runners["triton"].execute(step)
        assert got.shape == ref.shape == (step.num_sampled, runners["torch"].model_config.vocab_size)
        torch.testing.assert_close(got, ref, **TOL)
    for (k_ref, v_ref, *_), (k_got, v_got, *_) in zip(
        runners["torch"].kv_caches, runners["triton"].kv_caches, strict=True
    ):
        torch.testing.assert_close(k_got, k_ref, **TOL)
        torch.testing.assert_close(v_got, v_ref, **TOL)


def test_startup_step_runs_both_prefill_attention_paths(
    tiny_checkpoint_factory: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory-profiling step (a prefix-free prompt: the step's K/V rows) is followed by a step with
    cached context (the pages), so on a GPU both prefill variants compile at start, not while serving."""
    from kvpilot.runtime.kernels import attention_triton

    seen: list[bool] = []
    real = attention_triton.paged_prefill_attention_triton

    def spy(*a: object, **k: object) -> torch.Tensor:
        seen.append(k.get("step_kv") is not None)
        return real(*a, **k)

    monkeypatch.setattr(attention_triton, "paged_prefill_attention_triton", spy)
    ckpt = tiny_checkpoint_factory("qwen3", num_key_value_heads=2)
    args = EngineArgs(
        model=str(ckpt),
        block_size=4,
        num_kv_blocks=8,
        device=DEVICE,
        dtype="float32",
        kernel_backend="triton",
    )
    ModelRunner(args)._worst_step(1, 40)  # what the runner profiles on a GPU (one 40-token prompt)
    assert set(seen) == {True, False}


def test_prefill_graph_on_triton_reads_the_steps_rows(tiny_checkpoint_factory: Callable[..., Path]) -> None:
    """A lone prompt's prefill graph (the CPU stand-in: same buffers and padding layout) on the triton
    kernels takes the step_kv path (prefix-free: a padding sequence, then the prompt) and gives the
    torch backend's logits and cache."""
    ckpt = tiny_checkpoint_factory("qwen3", num_key_value_heads=2)

    def make(backend: str) -> ModelRunner:
        args = EngineArgs(
            model=str(ckpt),
            block_size=16,
            num_kv_blocks=40,
            max_model_len=512,
            device=DEVICE,
            dtype="float32",
            kernel_backend=backend,
        )
        return ModelRunner(args)

    graphed, ref = make("triton"), make("torch")
    graphed._capture_prefill_graphs(EngineArgs(model=str(ckpt), max_model_len=512), eager=True)
    batch = StepBatch([SeqChunk(0, [(7 * i + 3) % 97 + 1 for i in range(200)], 0, list(range(3, 16)), True)])
    assert graphed.prefill_graphs is not None
    assert graphed.prefill_graphs.bucket(batch) == 256  # after 56 padding rows
    assert graphed.prefill_graphs._meta(256).prefix_free
    torch.testing.assert_close(graphed.execute(batch).float(), ref.execute(batch).float(), **TOL)
    for mine, theirs in zip(graphed.kv_caches, ref.kv_caches, strict=True):
        torch.testing.assert_close(mine.k, theirs.k, **TOL)
        torch.testing.assert_close(mine.v, theirs.v, **TOL)
