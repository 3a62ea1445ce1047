"""`kvpilot up`'s model resolution (no processes started): the built-in SmolLM2, --model-dir with a Hugging
Face directory or a GGUF file (converted into the state dir, served under the model's own name)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from kvpilot.cli.up import BUILTIN_NAME, model_name, parser, resolve_service
from kvpilot.runtime.default_model import NAME
from kvpilot.runtime.fixtures import make_tiny_checkpoint
from kvpilot.runtime.fixtures.gguf_file import write_gguf


def args(*argv: str) -> argparse.Namespace:
    return parser().parse_args(list(argv))


def test_names_follow_the_model() -> None:
    assert BUILTIN_NAME == NAME == "smollm2-135m-instruct"
    assert model_name(Path("/models/Qwen2.5-0.5B-Instruct")) == "qwen2-5-0-5b-instruct"
    assert model_name(Path("SmolLM2-135M-Instruct.Q4_1.gguf")) == "smollm2-135m-instruct-q4-1"
    assert model_name(Path("___")) == "model"


def test_model_dir_is_served_under_its_own_name(tmp_path: Path) -> None:
    checkpoint = make_tiny_checkpoint(tmp_path / "My-Model", "qwen3")
    service = resolve_service(args("--model-dir", str(checkpoint), "--state-dir", str(tmp_path / "state")))
    assert service.name == "my-model" and service.model_dir == checkpoint
    assert service.manifest["metadata"]["name"] == "my-model"
    assert service.manifest["spec"]["model"]["servedName"] == "my-model"


def test_a_gguf_model_dir_is_converted_into_the_state_dir(tmp_path: Path) -> None:
    gguf_file = write_gguf(make_tiny_checkpoint(tmp_path / "hf", "llama2"), tmp_path / "Tiny-Llama.gguf")
    state = tmp_path / "state"
    service = resolve_service(args("--model-dir", str(gguf_file), "--state-dir", str(state)))
    assert service.name == "tiny-llama"
    assert service.model_dir.parent == state / "models" and (service.model_dir / "config.json").is_file()
    assert service.manifest["spec"]["model"]["config"]["architectures"] == ["LlamaForCausalLM"]


def test_a_directory_that_is_no_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="neither a Hugging Face model directory"):
        resolve_service(args("--model-dir", str(tmp_path), "--state-dir", str(tmp_path / "state")))


def test_the_builtin_model_is_smollm2(tmp_path: Path) -> None:
    service = resolve_service(args("--state-dir", str(tmp_path / "state")))
    assert service.name == "smollm2-135m-instruct"
    assert service.manifest["spec"]["model"]["uri"] == "hf://HuggingFaceTB/SmolLM2-135M-Instruct"
    config = service.manifest["spec"]["model"]["config"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
