"""int4 / int8 at load keep the grid of weights that are already GGUF Q4_0, Q4_1 or Q8_0 (quant/gguf_grid.py):
the weights come back exactly, as a group-32 weight (Q4_1's fractional zero points as whole zeros plus
per-group offsets), and the model serves the tokens it serves unquantized; weights off any grid go through
round-to-nearest."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.config import ModelConfig
from kvpilot.runtime.fixtures.gguf_grids import (
    decoded,
    make_grid_checkpoint,
    q4_0,
    q4_1,
    q4_k_blocks,
    q6_k_blocks,
    q8_0,
)
from kvpilot.runtime.kernels.quant_reference import dequantize_int_ref, int_gemm_ref
from kvpilot.runtime.layers.kernel_ops import torch_ops
from kvpilot.runtime.llm import LLM
from kvpilot.runtime.loader import load_model
from kvpilot.runtime.quant.gguf_grid import gguf_weight, grid_note, on_q6_k_grid, recover_gguf_grid
from kvpilot.runtime.quant.int_weight import IntWeight, add_offsets, dense_weight, merge_parts
from kvpilot.runtime.sampling_params import SamplingParams
from safetensors.torch import load_file


def q4_k(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Raw Q4_K blocks as the gguf package decodes them (what a converted Q4_K file holds)."""
    return decoded(q4_k_blocks(n * k // 256, 256, seed)[0], n * k // 256, "Q4_K").view(n, k)


def q6_k(n: int, k: int, seed: int = 0) -> torch.Tensor:
    raw, by_formula = q6_k_blocks(n * k // 256, 256, seed)
    weight = decoded(raw, n * k // 256, "Q6_K").view(n, k)
    assert torch.equal(weight, by_formula.view(n, k))  # the packing is ggml's: its decoder agrees
    return weight


def recovered(weight: torch.Tensor, dtype: torch.dtype, bits: int = 4) -> IntWeight:
    grid = recover_gguf_grid(weight, bits, dtype)
    assert grid is not None and grid.scales.shape == (weight.shape[1] // 32, weight.shape[0])
    assert bool((grid.zeros == grid.zeros.round()).all()) and bool((grid.scales > 0).all())
    assert bool(grid.zeros.ge(0).all()) and bool(grid.zeros.le((1 << bits) - 1).all())
    return grid


def test_a_q4_0_grid_comes_back_exactly_with_whole_zero_points() -> None:
    w = q4_0(48, 256)
    grid = recovered(w, torch.float32)
    assert grid.offsets is None
    torch.testing.assert_close(dense_weight(grid).t(), w, rtol=0, atol=1e-6)
    # the same grid stored in bf16 is still recognised, and rebuilt within bf16's rounding of the weights
    w16 = w.bfloat16().float()
    torch.testing.assert_close(
        dense_weight(recovered(w16, torch.bfloat16)).t().float(), w, rtol=2e-2, atol=1e-6
    )


def test_a_q4_1_grid_comes_back_exactly_as_whole_zeros_plus_offsets() -> None:
    w = q4_1(48, 256)
    grid = recovered(w, torch.float32)
    assert grid.offsets is not None and grid.offsets.shape == grid.scales.shape
    assert bool(grid.offsets.abs().le(grid.scales / 2 + 1e-9).all())  # the nearest whole zero: half a step
    assert float(grid.offsets.abs().amax()) > 0  # the zeros were fractional: the offsets carry them
    torch.testing.assert_close(dense_weight(grid).t(), w, rtol=0, atol=1e-6)
    # without its offsets the grid is a different weight: the test above depends on them
    assert float((dequantize_int_ref(grid.qweight, grid.scales, grid.zeros, 4).t() - w).abs().amax()) > 1e-4
    # from a bf16 copy, in bf16: within a few bf16 roundings of the largest weights (the block extremes set
    # the step), where round-to-nearest would be off by up to half a step (5e-3 here)
    bf16 = dense_weight(recovered(w.bfloat16().float(), torch.bfloat16)).t().float()
    torch.testing.assert_close(bf16, w, rtol=0, atol=float(w.abs().amax()) * 2**-7)


def test_a_q4_k_grid_comes_back_exactly_though_its_q_spans_fewer_steps() -> None:
    """Q4_K's sub-blocks of 32 lie on 16 levels that the weights need not reach at either end: the block's
    [min, max] spans 10..15 steps here, and each block's count of steps is found. The values come from
    the gguf package's decoder of raw Q4_K blocks (q4_k), which agrees with ggml's formula."""
    raw, by_formula = q4_k_blocks(8, 512, seed=2)
    import gguf
    import numpy as np

    decoded = gguf.quants.dequantize(
        np.frombuffer(raw, np.uint8).reshape(8, -1), gguf.GGMLQuantizationType.Q4_K
    )
    assert np.array_equal(decoded, by_formula.numpy())
    w = q4_k(48, 256, seed=4)
    grid = recovered(w, torch.float32)
    assert grid.offsets is not None
    torch.testing.assert_close(dense_weight(grid).t(), w, rtol=0, atol=1e-6)
    steps = (w.view(48, 8, 32).amax(-1) - w.view(48, 8, 32).amin(-1)) / grid.scales.t()
    assert set(steps.round().int().unique().tolist()) > {15}  # blocks of fewer steps were found too
    torch.testing.assert_close(steps, steps.round(), rtol=0, atol=1e-3)


def test_a_q8_0_grid_comes_back_exactly_as_int8_in_groups_of_32() -> None:
    w = q8_0(48, 256)
    grid = recovered(w, torch.float32, bits=8)
    assert grid.offsets is None and bool(grid.zeros.eq(128).all())
    torch.testing.assert_close(dense_weight(grid).t(), w, rtol=0, atol=1e-7)
    assert recover_gguf_grid(w, 4, torch.float32) is None  # 255 levels are no 4-bit grid
    assert recover_gguf_grid(q4_1(48, 256), 8, torch.float32) is None  # nor 16 levels over [min, max] Q8_0


def test_a_q5_k_like_grid_comes_back_exactly_under_int8() -> None:
    """32 levels per sub-block of 32 that q need not span (Q5_K: w = d sc q - dmin m, q in 0..31): an int8
    group-32 weight with offsets."""
    gen = torch.Generator().manual_seed(6)
    q = (torch.rand(48, 8, 32, generator=gen) * torch.randint(20, 32, (48, 8, 1), generator=gen)).round()
    scale = (torch.rand(48, 8, 1, generator=gen) * 1e-3 + 1e-4).half().float()
    w = (q * scale - scale * torch.randint(0, 40, (48, 8, 1), generator=gen)).reshape(48, 256)
    grid = recovered(w, torch.float32, bits=8)
    assert grid.offsets is not None
    torch.testing.assert_close(dense_weight(grid).t(), w, rtol=0, atol=1e-7)


def test_the_gemm_plus_offset_term_is_the_dense_matmul() -> None:
    """The path of the GPU kernels: the integer GEMM on whole zeros, then x's group sums times the offsets."""
    w = q4_1(40, 128, seed=3)
    grid = recovered(w, torch.float32)
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(1))
    got = add_offsets(int_gemm_ref(x, grid.qweight, grid.scales, grid.zeros, 4), x, grid.offsets)
    torch.testing.assert_close(got, x @ w.t(), rtol=1e-5, atol=1e-5)
    # bf16, as on a GPU: within bf16 rounding of the output of the float32 weights
    x16, y16 = (
        x.bfloat16(),
        int_gemm_ref(x.bfloat16(), grid.qweight, grid.scales.bfloat16(), grid.zeros.bfloat16(), 4),
    )
    got16 = add_offsets(y16.view(1, 5, -1), x16.view(1, 5, 128), grid.offsets.bfloat16())
    assert got16.shape == (1, 5, 40) and got16.dtype == torch.bfloat16
    want = x16.float() @ w.t()
    assert float((got16.view(5, 40).float() - want).abs().amax()) < 2e-2 * float(want.abs().amax())


def test_fused_shards_with_and_without_offsets_merge() -> None:
    a, b = recovered(q4_1(32, 128, seed=1), torch.float32), recovered(q4_0(16, 128, seed=2), torch.float32)
    (merged,) = merge_parts([a, b])
    assert merged.offsets is not None and merged.offsets.shape == (4, 48)
    want = torch.cat([dense_weight(a), dense_weight(b)], dim=1)
    torch.testing.assert_close(dense_weight(merged), want, rtol=0, atol=0)


def test_other_weights_are_left_to_round_to_nearest() -> None:
    gen = torch.Generator().manual_seed(0)
    for bits in (4, 8):
        assert recover_gguf_grid(0.02 * torch.randn(64, 256, generator=gen), bits, torch.float32) is None
    assert recover_gguf_grid(q4_0(64, 256)[:, :240], 4, torch.float32) is None  # K not whole blocks of 32
    for grid, bits, steps in ((q4_0, 4, 15), (q4_1, 4, 15), (q4_k, 4, 15), (q8_0, 8, 254)):
        off = grid(300, 256)
        off[299, 40] += 0.3 * (off[299, 32:64].amax() - off[299, 32:64].amin()) / steps  # past the probe
        assert recover_gguf_grid(off, bits, torch.float32) is None


@pytest.mark.parametrize(
    ("grid", "quantization"), [("q4_0", "int4"), ("q4_1", "int4"), ("q4_k", "int4"), ("q8_0", "int8")]
)
def test_at_load_a_gguf_grid_model_serves_its_tokens(grid: str, quantization: str, tmp_path: Path) -> None:
    """A model whose projections lie on Q4_0, Q4_1, Q4_K or Q8_0 grids (as a dequantized GGUF's do) holds
    under int4 / int8 exactly its 16-bit weights, where round-to-nearest (int4: groups of 64, int8: one scale
    per output channel) would move them, and serves its tokens; the GPU's path (the integer GEMM, then the
    offsets) gives the dense path's outputs."""
    path = make_grid_checkpoint(tmp_path / grid, grid)
    weights = load_file(str(path / "model.safetensors"))
    config = ModelConfig.from_dir(path)
    model = load_model(
        path,
        config,
        device=torch.device("cpu"),
        dtype=torch.float32,
        ops=torch_ops(),
        quantization=quantization,
    )
    x = torch.randn(3, config.hidden_size, generator=torch.Generator().manual_seed(0))
    for block, fused, parts in [("self_attn", "qkv_proj", "qkv"), ("mlp", "gate_up_proj", ("gate", "up"))]:
        layer = model.get_submodule(f"model.layers.1.{block}.{fused}")
        method = layer.quant_method
        got = torch.cat([dense_weight(p).t() for p in method.parts])
        want = torch.cat([weights[f"model.layers.1.{block}.{p}_proj.weight"] for p in parts])
        assert (
            method.parts[0].scales.shape[0] == 64 // 32
        )  # the grid's group 32 (round-to-nearest: 64, or one per row)
        assert (method.parts[0].offsets is not None) == (grid in ("q4_1", "q4_k"))
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        dense_out = method.apply(layer, x, None)
        method.dense = []  # what a GPU runs: int_gemm(_ref) on whole zeros, then add_offsets
        torch.testing.assert_close(method.apply(layer, x, None), dense_out, rtol=1e-5, atol=1e-5)
    prompts = ["the cat sat on", "a quick brown fox"]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    outs = []
    for quant in (None, quantization):
        llm = LLM(str(path), device="cpu", dtype="float32", max_model_len=128, quantization=quant)
        outs.append([o.token_ids for o in llm.generate(prompts, params)])
    assert outs[0] == outs[1]


@pytest.mark.parametrize(
    ("qtype", "quantization"),
    [("Q4_0", "int4"), ("Q4_1", "int4"), ("Q8_0", "int8"), ("Q5_0", "int8"), ("Q5_1", "int8")],
)
def test_a_gguf_file_quantized_by_ggml_keeps_its_grid(
    qtype: str,
    quantization: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """End to end with ggml's own quantizer (the gguf package's, an independent oracle): a tiny model written
    as a Q4_0 / Q4_1 / Q8_0 / Q5_0 / Q5_1 GGUF file serves under int4 / int8 the tokens of its dequantized
    weights, every projection on its file's grid (group 32)."""
    from kvpilot.runtime.fixtures import make_tiny_checkpoint
    from kvpilot.runtime.fixtures.gguf_file import write_gguf

    monkeypatch.setenv("KVPILOT_CACHE_DIR", str(tmp_path / "cache"))
    checkpoint = make_tiny_checkpoint(tmp_path / "hf", "llama2", hidden_size=128, intermediate_size=256)
    gguf_file = write_gguf(checkpoint, tmp_path / f"tiny.{qtype}.gguf", qtype=qtype)
    prompts = ["the cat sat on", "a quick brown fox"]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=1)
    runs = []
    for quant in (None, quantization):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="kvpilot.runtime.loader"):
            llm = LLM(str(gguf_file), device="cpu", dtype="float32", max_model_len=128, quantization=quant)
        hint = f"projections are 14 {qtype}: --quantization {quantization} keeps them at their bits"
        assert (hint in caplog.text) == (quant is None), caplog.text  # the hint only where it is not used
        runs.append(llm.generate(prompts, params))
        if quant is not None:
            for name, module in llm.engine.runner.model.named_modules():
                parts = getattr(getattr(module, "quant_method", None), "parts", [])
                for part in parts:  # group 32 (round-to-nearest: 64 for int4, one per row for int8)
                    assert part.scales.shape[0] * 32 * part.bits == part.qweight.shape[0] * 32, name
                    assert (part.offsets is not None) == (qtype in ("Q4_1", "Q5_1")), name
    for plain, quantized in zip(*runs, strict=True):
        assert quantized.token_ids == plain.token_ids
        for a, b in zip(plain.logprobs, quantized.logprobs, strict=True):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)


def test_the_load_note_names_how_to_keep_a_gguf_grid_or_what_is_rounded_again() -> None:
    assert grid_note({"F32": 3}, None) is None and grid_note({}, "int4") is None
    assert "--quantization int4 keeps them" in (grid_note({"Q4_K": 150, "F16": 2}, None) or "")
    assert "--quantization int8 keeps them" in (grid_note({"Q5_K": 100, "Q8_0": 2}, None) or "")
    q4_k_m = {"Q4_K": 100, "Q6_K": 40}
    assert "--quantization int4 keeps them at their bits (Q6_K at 8 bits)" in (grid_note(q4_k_m, None) or "")
    assert "the Q6_K ones are held at 8 bits" in (grid_note(q4_k_m, "int4") or "")
    assert grid_note({"Q4_K": 100, "Q3_K": 40}, None) is None  # no one method keeps every type
    assert "--quantization int8 keeps them at their bits (Q6_K at 8 bits)" in (
        grid_note({"Q6_K": 9}, None) or ""
    )
    mixed = grid_note({"Q4_K": 100, "Q3_K": 40, "Q6_K": 1}, "int4") or ""
    assert "Q6_K ones are held at 8 bits (int8 groups of 32); the Q3_K ones are rounded again" in mixed
    under_int8 = grid_note(q4_k_m, "int8") or ""
    assert "Q6_K ones are held at 8 bits (int8 groups of 32); the Q4_K ones are rounded again" in under_int8
    assert grid_note({"Q4_1": 10}, "int4") is None  # everything kept: nothing to say


def test_under_int4_a_q6_k_weight_is_held_at_8_bits() -> None:
    """Q6_K (16-input sub-blocks, two scales per 32 inputs) fits no group-32 grid; a Q4_K_M file keeps its
    sensitive projections in it, so int4 holds them at int8 in groups of 32 (within an eighth of the coarser
    Q6_K step of each 32 inputs), not at 4 bits."""
    w = q6_k(48, 256, seed=3)
    assert on_q6_k_grid(w) and recover_gguf_grid(w, 4, torch.float32) is None
    assert not on_q6_k_grid(0.02 * torch.randn(48, 256, generator=torch.Generator().manual_seed(0)))
    held = gguf_weight(w, "int4", torch.float32)
    assert held is not None and held.bits == 8 and held.scales.shape == (8, 48)
    error = (dense_weight(held).t() - w).abs().view(48, 8, 32).amax(-1)
    coarser_q6_step = w.abs().view(48, 8, 32).amax(-1) / 31  # of the group's two sub-blocks
    assert bool((error <= coarser_q6_step / 8).all())
    assert gguf_weight(q4_k(48, 256), "int4", torch.float32).bits == 4  # type: ignore[union-attr]
    assert gguf_weight(q8_0(48, 256), "int4", torch.float32) is None  # Q8_0 under int4: rounded to 4 bits
    under_int8 = gguf_weight(w, "int8", torch.float32)  # int8 groups of 32, not one scale per channel
    assert under_int8 is not None and under_int8.scales.shape == (8, 48)


def test_int4_on_a_q4_k_m_like_model_serves_its_mix(tmp_path: Path) -> None:
    """Q4_K projections at 4 bits with offsets, the Q6_K v_proj and down_proj at 8 bits (v its own GEMM
    beside q and k): the model serves its 16-bit tokens."""
    path = make_grid_checkpoint(tmp_path / "q4_k_m", "q4_k", mix={"v_proj": "q6_k", "down_proj": "q6_k"})
    prompts = ["the cat sat on", "a quick brown fox"]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=1)
    runs = []
    for quant in (None, "int4"):
        llm = LLM(str(path), device="cpu", dtype="float32", max_model_len=128, quantization=quant)
        runs.append(llm.generate(prompts, params))
        if quant is not None:
            model = llm.engine.runner.model
            qkv = model.get_submodule("model.layers.0.self_attn.qkv_proj").quant_method.parts
            down = model.get_submodule("model.layers.0.mlp.down_proj").quant_method.parts
            assert [p.bits for p in qkv] == [4, 8] and [p.bits for p in down] == [8]  # q and k: one GEMM
    for plain, quantized in zip(*runs, strict=True):  # Q6_K rounded onto int8: close, not exact
        assert quantized.token_ids == plain.token_ids
        for a, b in zip(plain.logprobs, quantized.logprobs, strict=True):
            assert a.logprob == pytest.approx(b.logprob, abs=5e-2)
