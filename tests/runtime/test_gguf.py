"""GGUF loading on tiny checkpoints written as llama.cpp writes them (fixtures/gguf_file.py): the
conversion gives back the checkpoint's exact weights (Llama Q/K un-permuted) and tokenizer, the engine on
the .gguf equals the engine on the checkpoint, conversions are cached, and bad files fail at start with
one clear error. The real SmolLM2 GGUF is covered by test_real_model.py."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.errors import ModelLoadError, UnsupportedModelError
from kvpilot.runtime.fixtures.checkpoint import ENDOFTEXT
from kvpilot.runtime.fixtures.gguf_file import write_gguf
from kvpilot.runtime.fixtures.tokenizer_files import CORPUS_PATH
from kvpilot.runtime.gguf_model import convert_cached, convert_gguf, find_gguf, resolve_model_dir
from kvpilot.runtime.llm import LLM
from kvpilot.runtime.sampling_params import SamplingParams
from kvpilot.runtime.tokenizer import Tokenizer
from safetensors.torch import load_file

from tests.runtime.server_helpers import free_port, runtime_command

# name -> (fixture family, config overrides): GQA Llama exercises the K permutation with fewer heads
CASES = {
    "llama-gqa": ("llama2", {"num_key_value_heads": 2}),
    "llama-untied": ("llama2", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
}
TEXT = CORPUS_PATH.read_text(encoding="utf-8")[:2000] + "\n<|im_start|>user\n123456 naïve café 🚀<|im_end|>"


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Conversions go to the test's own cache, never to ~/.cache."""
    monkeypatch.setenv("KVPILOT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def gguf_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, Path]]:
    """make(case, qtype="F32") -> (checkpoint dir, .gguf file), memoised."""
    from kvpilot.runtime.fixtures import make_tiny_checkpoint

    made: dict[tuple[str, str], tuple[Path, Path]] = {}

    def make(case: str, qtype: str = "F32") -> tuple[Path, Path]:
        if (case, qtype) not in made:
            family, overrides = CASES[case]
            root = tmp_path_factory.mktemp(f"gguf-{case}")
            checkpoint = make_tiny_checkpoint(root / "hf", family, **overrides)
            made[case, qtype] = (
                checkpoint,
                write_gguf(checkpoint, root / f"{case}.{qtype}.gguf", qtype=qtype),
            )
        return made[case, qtype]

    return make


@pytest.mark.parametrize("case", sorted(CASES))
def test_conversion_gives_back_the_exact_checkpoint(case: str, gguf_factory, tmp_path: Path) -> None:
    checkpoint, gguf_file = gguf_factory(case)
    out = convert_gguf(gguf_file, tmp_path / "hf")
    want, got = load_file(checkpoint / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    config, original = (json.loads((d / "config.json").read_text()) for d in (out, checkpoint))
    for key in ("architectures", "vocab_size", "hidden_size", "num_key_value_heads", "tie_word_embeddings"):
        assert config[key] == original[key], key
    assert config["head_dim"] == original.get("head_dim", original["hidden_size"] // 4)
    assert config["rope_theta"] == original["rope_theta"]


def test_quantized_tensors_are_dequantized_by_the_gguf_package(gguf_factory, tmp_path: Path) -> None:
    checkpoint, gguf_file = gguf_factory("llama-gqa", "Q8_0")
    want = load_file(checkpoint / "model.safetensors")
    got = load_file(convert_gguf(gguf_file, tmp_path / "hf") / "model.safetensors")
    for name, tensor in want.items():
        scale = tensor.abs().max()
        assert (got[name] - tensor).abs().max() <= scale / 127, name  # within Q8_0's step, not permuted


@pytest.mark.parametrize("case", ["llama-gqa", "qwen3"])
def test_tokenizer_and_chat_template_come_from_the_metadata(case: str, gguf_factory) -> None:
    checkpoint, gguf_file = gguf_factory(case)
    original, converted = Tokenizer.from_dir(checkpoint), Tokenizer.from_dir(gguf_file)
    assert converted.encode(TEXT) == original.encode(TEXT)
    plain = original.encode(TEXT, add_special_tokens=False)
    assert converted.encode(TEXT, add_special_tokens=False) == plain
    assert converted.decode(plain, skip_special_tokens=False) == TEXT
    assert converted.bos_token_id == original.bos_token_id
    assert converted.token_to_id(ENDOFTEXT) == original.token_to_id(ENDOFTEXT)
    assert original.eos_token_ids >= {original.token_to_id(original.eos_token)}
    assert converted.token_to_id(converted.eos_token) == original.token_to_id(original.eos_token)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert converted.apply_chat_template(messages) == original.apply_chat_template(messages)


@pytest.mark.parametrize("case", ["llama-gqa", "qwen2"])
def test_engine_on_the_gguf_equals_the_engine_on_the_checkpoint(case: str, gguf_factory) -> None:
    checkpoint, gguf_file = gguf_factory(case)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)
    prompts = ["The quick brown fox", "Hello, my name is", "kv cache"]
    kw = {"device": "cpu", "dtype": "float32", "max_model_len": 128}
    want = LLM(str(checkpoint), **kw).generate(prompts, params)
    # the directory holding the file is served the same way as the file itself
    got = LLM(str(gguf_file.parent), **kw).generate(prompts, params)
    for w, g in zip(want, got, strict=True):
        assert g.prompt_token_ids == w.prompt_token_ids
        assert g.token_ids == w.token_ids
        assert [lp.logprob for lp in g.logprobs] == pytest.approx([lp.logprob for lp in w.logprobs], abs=1e-5)


def test_conversion_is_cached_by_content(gguf_factory, tmp_path: Path, private_cache: Path) -> None:
    _, gguf_file = gguf_factory("qwen3")
    first = resolve_model_dir(gguf_file)
    assert first.parent == private_cache / "gguf" and (first / "config.json").is_file()
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    (tmp_path / "elsewhere").mkdir()
    copy = tmp_path / "elsewhere" / gguf_file.name  # the same content under another path
    copy.write_bytes(gguf_file.read_bytes())
    assert convert_cached(copy, private_cache / "gguf") == convert_cached(gguf_file, private_cache / "gguf")
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # not converted again
    assert [p.name for p in (private_cache / "gguf").iterdir()] == [first.name]  # no scratch left behind


def test_hugging_face_directories_are_left_alone(gguf_factory, tmp_path: Path) -> None:
    checkpoint, gguf_file = gguf_factory("qwen3")
    assert resolve_model_dir(checkpoint) == checkpoint
    assert find_gguf(tmp_path) is None  # an empty directory is no GGUF model (the loaders say what lacks)
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(gguf_file.read_bytes())
    with pytest.raises(ModelLoadError, match="several GGUF files"):
        resolve_model_dir(two)
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_dir(tmp_path / "missing.gguf")


def _truncated(data: bytes, path: Path) -> None:
    path.write_bytes(data[: len(data) * 9 // 10])


def _garbage(data: bytes, path: Path) -> None:
    path.write_bytes(os.urandom(4096))


def _empty(data: bytes, path: Path) -> None:
    path.write_bytes(b"")


@pytest.mark.parametrize("damage", [_truncated, _garbage, _empty])
def test_a_damaged_file_is_one_clear_error(damage: Callable, gguf_factory, tmp_path: Path) -> None:
    _, gguf_file = gguf_factory("qwen3")
    bad = tmp_path / "bad.gguf"
    damage(gguf_file.read_bytes(), bad)
    with pytest.raises(ModelLoadError, match=r"cannot read GGUF file .*bad\.gguf.*truncated or corrupted"):
        Tokenizer.from_dir(bad)
    assert not any((tmp_path / "cache").glob("gguf/*")), "nothing half-converted is left in the cache"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"architecture": "phi3"}, UnsupportedModelError, "GGUF architecture 'phi3' is not supported"),
        ({"tokenizer": False}, ModelLoadError, "has no tokenizer section"),
        ({"pre": "deepseek-llm"}, UnsupportedModelError, "pre-tokenizer 'deepseek-llm' is not supported"),
    ],
)
def test_unsupported_files_are_refused_at_start(kwargs, error, message, gguf_factory, tmp_path: Path) -> None:
    checkpoint, _ = gguf_factory("qwen3")
    bad = write_gguf(checkpoint, tmp_path / "model.gguf", **kwargs)
    with pytest.raises(error, match=message):
        LLM(str(bad), device="cpu", max_model_len=64)


def test_the_runtime_exits_with_the_error_on_a_corrupt_gguf(gguf_factory, tmp_path: Path) -> None:
    import subprocess

    _, gguf_file = gguf_factory("qwen3")
    bad = tmp_path / "broken.gguf"
    _truncated(gguf_file.read_bytes(), bad)
    env = {**os.environ, "KVPILOT_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        runtime_command(bad, free_port()), env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "cannot read GGUF file" in done.stdout + done.stderr and "broken.gguf" in done.stdout + done.stderr
