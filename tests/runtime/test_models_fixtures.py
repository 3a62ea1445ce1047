"""The tiny-checkpoint generator: files, determinism, sharding, padded vocabularies, bad arguments."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.engine.batch import SeqChunk, StepBatch
from kvpilot.runtime.engine.engine_args import EngineArgs
from kvpilot.runtime.engine.model_runner import ModelRunner
from kvpilot.runtime.fixtures import FAMILIES, make_tiny_checkpoint
from kvpilot.runtime.fixtures.tokenizer_files import CORPUS_PATH
from safetensors import safe_open

FILES = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "model.safetensors",
}


def test_every_family_writes_a_hugging_face_directory(tiny_checkpoint_factory: Callable) -> None:
    for family in FAMILIES:
        path = tiny_checkpoint_factory(family)
        assert {p.name for p in path.iterdir()} == FILES
        config = json.loads((path / "config.json").read_text())
        assert config["architectures"][0] in {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}
        assert config["hidden_size"] == 64 and config["num_hidden_layers"] == 2
        assert "{%" in json.loads((path / "tokenizer_config.json").read_text())["chat_template"]


def test_corpus_is_shipped_and_substantial() -> None:
    assert 20_000 <= CORPUS_PATH.stat().st_size <= 40_000


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    a = make_tiny_checkpoint(tmp_path / "a", "llama2", seed=1)
    b = make_tiny_checkpoint(tmp_path / "b", "llama2", seed=1)
    c = make_tiny_checkpoint(tmp_path / "c", "llama2", seed=2)
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_sharded_index_maps_every_tensor_to_the_file_holding_it(tiny_checkpoint_factory: Callable) -> None:
    path = tiny_checkpoint_factory("qwen3", shards=4)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    found: dict[str, str] = {}
    total = 0
    for name in files:
        with safe_open(str(path / name), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118
                found[key] = name
                tensor = handle.get_tensor(key)
                total += tensor.numel() * tensor.element_size()
    assert found == index["weight_map"]
    assert total == index["metadata"]["total_size"]
    assert not (path / "model.safetensors").exists()


def test_padded_vocab_beyond_the_tokenizer(tiny_checkpoint_factory: Callable, hf_logits: Callable) -> None:
    path = tiny_checkpoint_factory("qwen2", vocab_size=1100)
    runner = ModelRunner(EngineArgs(model=str(path), block_size=8, num_kv_blocks=4))
    tokens = [3, 1099, 17, 1050, 400]
    logits = runner.execute(StepBatch([SeqChunk(0, tokens, 0, [0], True)]))
    assert logits.shape == (1, 1100)
    torch.testing.assert_close(logits[0], hf_logits(path, tokens)[-1], atol=1e-4, rtol=0)


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown fixture family 'gpt2'"):
        make_tiny_checkpoint(tmp_path, "gpt2")
    with pytest.raises(ValueError, match="vocab_size 100 is smaller than the tokenizer's"):
        make_tiny_checkpoint(tmp_path, "qwen3", vocab_size=100)
    with pytest.raises(ValueError, match="shards must be at least 1"):
        make_tiny_checkpoint(tmp_path, "qwen3", shards=0)
