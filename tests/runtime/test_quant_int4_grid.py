"""int4 at load keeps the grid of weights that are already GGUF Q4_0 (quant/int4_grid.py): the weights come
back exactly, as an int4 group-32 weight with whole zero points, and the model serves the tokens it serves
unquantized; Q4_1 weights (fractional zeros) and weights off any grid go through round-to-nearest."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from kvpilot.runtime.config import ModelConfig
from kvpilot.runtime.kernels.quant_reference import dequantize_int_ref
from kvpilot.runtime.layers.kernel_ops import torch_ops
from kvpilot.runtime.llm import LLM
from kvpilot.runtime.loader import load_model
from kvpilot.runtime.quant.int4_grid import recover_q4_0_grid
from kvpilot.runtime.sampling_params import SamplingParams
from safetensors.torch import load_file, save_file

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def q4_0(n: int, k: int, seed: int = 0, spread: float = 0.003) -> torch.Tensor:
    """W [N, K] as ggml dequantizes Q4_0: d (q - 8) per block of 32 inputs, d = the signed weight of largest
    magnitude / -8 (fp16 in the file), so that weight has q = 0; d of either sign; one block all zero."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(1, 16, (n, k // 32, 32), generator=gen).float()
    q[..., 5] = 0
    d = (torch.randn(n, k // 32, 1, generator=gen) * spread).half().float()
    w = (q - 8) * d
    w[min(1, n - 1), 0] = 0
    return w.reshape(n, k)


def q4_1(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """W [N, K] as ggml dequantizes Q4_1: d q + m per block of 32 (q spanning 0..15, m about -8 d)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k // 32, 32), generator=gen).float()
    q[..., 0], q[..., 1] = 0, 15
    d = (torch.rand(n, k // 32, 1, generator=gen) * 0.01 + 1e-3).half().float()
    m = (-d * (4 + 7 * torch.rand(n, k // 32, 1, generator=gen))).half().float()
    return (q * d + m).reshape(n, k)


def dequantized(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    grid = recover_q4_0_grid(weight, dtype)
    assert grid is not None and grid.scales.shape == (weight.shape[1] // 32, weight.shape[0])
    assert bool((grid.zeros == grid.zeros.round()).all()) and bool((grid.scales > 0).all())
    return dequantize_int_ref(grid.qweight, grid.scales.float(), grid.zeros.float(), 4).t()


def test_a_q4_0_grid_comes_back_exactly_with_whole_zero_points() -> None:
    w = q4_0(48, 256)
    torch.testing.assert_close(dequantized(w, torch.float32), w, rtol=0, atol=1e-6)
    # the same grid stored in bf16 is still recognised, and rebuilt within bf16's rounding of the weights
    w16 = w.bfloat16().float()
    torch.testing.assert_close(dequantized(w16, torch.bfloat16), w, rtol=2e-2, atol=1e-6)


def test_other_weights_are_left_to_round_to_nearest() -> None:
    gen = torch.Generator().manual_seed(0)
    assert recover_q4_0_grid(0.02 * torch.randn(64, 256, generator=gen), torch.float32) is None
    assert recover_q4_0_grid(q4_1(64, 256), torch.float32) is None  # fractional zero points
    assert recover_q4_0_grid(q4_0(64, 256)[:, :240], torch.float32) is None  # K not whole blocks of 32
    off = q4_0(300, 256)
    off[299, 40] += 0.3 * off[299, 32:64].abs().amax() / 8  # one weight a third of a step off, past the probe
    assert recover_q4_0_grid(off, torch.float32) is None


def test_int4_at_load_of_a_q4_0_model_serves_its_tokens(
    tiny_checkpoint_factory: Callable, tmp_path: Path
) -> None:
    """A model whose projections lie on Q4_0 grids (as a dequantized GGUF's do) holds under int4 exactly its
    16-bit weights, where round-to-nearest in groups of 64 would move every one, and serves its tokens."""
    path = Path(shutil.copytree(tiny_checkpoint_factory("qwen3", seed=5), tmp_path / "q4_0"))
    weights = load_file(str(path / "model.safetensors"))
    for i, name in enumerate(sorted(weights)):
        if name.split(".")[-2] in PROJ and name.endswith(".weight"):
            weights[name] = q4_0(*weights[name].shape, seed=i, spread=0.03)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = ModelConfig.from_dir(path)
    model = load_model(
        path, config, device=torch.device("cpu"), dtype=torch.float32, ops=torch_ops(), quantization="int4"
    )
    for block, fused, parts in [("self_attn", "qkv_proj", "qkv"), ("mlp", "gate_up_proj", ("gate", "up"))]:
        method = model.get_submodule(f"model.layers.1.{block}.{fused}").quant_method
        got = torch.cat([dequantize_int_ref(p.qweight, p.scales, p.zeros, 4).t() for p in method.parts])
        want = torch.cat([weights[f"model.layers.1.{block}.{p}_proj.weight"] for p in parts])
        assert method.parts[0].scales.shape[0] == 64 // 32  # the grid's group 32, not round-to-nearest's 64
        torch.testing.assert_close(got, want, rtol=0, atol=1e-7)
    prompts = ["the cat sat on", "a quick brown fox"]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    outs = []
    for quantization in (None, "int4"):
        llm = LLM(str(path), device="cpu", dtype="float32", max_model_len=128, quantization=quantization)
        outs.append([o.token_ids for o in llm.generate(prompts, params)])
    assert outs[0] == outs[1]
