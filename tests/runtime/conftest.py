"""Shared runtime fixtures: tiny random checkpoints, written once per test session.

Checkpoints returned by these fixtures are shared: tests that damage files must copy them first
(see `copy_checkpoint`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from kvpilot.runtime.fixtures import make_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """make(family="qwen3", *, seed=0, shards=1, **config_overrides) -> checkpoint dir, memoised."""
    made: dict[str, Path] = {}

    def make(family: str = "qwen3", *, seed: int = 0, shards: int = 1, **overrides: Any) -> Path:
        key = json.dumps([family, seed, shards, overrides], sort_keys=True)
        if key not in made:
            path = tmp_path_factory.mktemp(f"ckpt-{family}")
            made[key] = make_tiny_checkpoint(path, family, seed=seed, shards=shards, **overrides)
        return made[key]

    return make


@pytest.fixture(scope="session")
def llama2_checkpoint(tiny_checkpoint_factory: Callable[..., Path]) -> Path:
    return tiny_checkpoint_factory("llama2")


@pytest.fixture(scope="session")
def llama3_checkpoint(tiny_checkpoint_factory: Callable[..., Path]) -> Path:
    return tiny_checkpoint_factory("llama3")


@pytest.fixture(scope="session")
def qwen2_checkpoint(tiny_checkpoint_factory: Callable[..., Path]) -> Path:
    return tiny_checkpoint_factory("qwen2")


@pytest.fixture(scope="session")
def qwen3_checkpoint(tiny_checkpoint_factory: Callable[..., Path]) -> Path:
    return tiny_checkpoint_factory("qwen3")


@pytest.fixture
def copy_checkpoint(tmp_path: Path) -> Callable[[Path], Path]:
    """A private, writable copy of a shared checkpoint (for tests that break files)."""

    def copy(source: Path) -> Path:
        return Path(shutil.copytree(source, tmp_path / source.name))

    return copy


@pytest.fixture(scope="session")
def hf_logits() -> Callable[[Path, list[int]], torch.Tensor]:
    """The oracle: hf_logits(model_dir, token_ids) -> [len(token_ids), vocab] float32 logits computed by
    transformers' AutoModelForCausalLM on the same checkpoint (models loaded once per directory)."""
    from transformers import AutoModelForCausalLM

    models: dict[Path, torch.nn.Module] = {}

    def logits(model_dir: Path, token_ids: list[int]) -> torch.Tensor:
        if model_dir not in models:
            models[model_dir] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            return models[model_dir](torch.tensor([token_ids])).logits[0].float()

    return logits
