"""`python -m kvpilot.runtime.eval` on a tiny checkpoint: the windows, the JSON report, one row per engine
configuration, a refused configuration as an error row (exit 1), the --max-delta gate. Its agreement with
transformers on the real model is in test_real_model.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from kvpilot.runtime.eval import EngineConfig, engine_perplexity, transformers_perplexity, windows
from kvpilot.runtime.eval.__main__ import main


def test_windows_cover_the_text_and_drop_a_lone_last_token() -> None:
    assert windows(list(range(10)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert windows(list(range(9)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError):
        windows([1, 2], 1)


def test_engine_configs_parse() -> None:
    assert EngineConfig.parse("dtype=bfloat16,kv=fp8") == EngineConfig("bfloat16", "fp8", "none")
    assert EngineConfig.parse("quantization=int8").engine_args()["quantization"] == "int8"
    with pytest.raises(ValueError, match="bad engine configuration"):
        EngineConfig.parse("dtype")


def test_engine_perplexity_equals_transformers_on_a_tiny_model(llama2_checkpoint: Path) -> None:
    parts = windows([(7 * i) % 900 + 5 for i in range(150)], 64)
    ours = engine_perplexity(str(llama2_checkpoint), parts, EngineConfig(dtype="float32"), device="cpu")
    theirs = transformers_perplexity(llama2_checkpoint, parts)
    assert ours.num_scored_tokens == theirs.num_scored_tokens == 147
    assert ours.perplexity == pytest.approx(theirs.perplexity, rel=1e-4)
    assert math.isclose(math.log(ours.perplexity), ours.nll_per_token)


def test_cli_prints_json_rows_and_fails_on_a_refused_configuration(
    qwen3_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "text.txt"
    text.write_text("The lighthouse keeper kept a notebook for every season of the year. " * 6)
    argv = ["--model", str(qwen3_checkpoint), "--text", str(text), "--window", "32", "--device", "cpu"]
    configs = ["--config", "dtype=float32", "--config", "dtype=float32,kv=bfloat16"]
    assert main([*argv, *configs, "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["text"]["tokens"] > 32 and len(report["text"]["sha256"]) == 64
    rows = report["results"]
    assert [r["config"]["kv_cache_dtype"] for r in rows] == ["auto", "bfloat16"]
    assert all(r["perplexity"] > 1 and r["error"] is None for r in rows)
    assert main([*argv, *configs, "--max-delta", "0.05"]) == 0  # a bfloat16 KV cache is within 5%
    capsys.readouterr()
    assert main([*argv, "--config", "dtype=float32", "--config", "quantization=int8"]) == 0
    capsys.readouterr()
    assert main([*argv, "--config", "dtype=float32", "--config", "quantization=awq"]) == 1
    out = capsys.readouterr().out
    assert "error (below)" in out and "--quantization awq needs an AWQ checkpoint" in out


def test_default_text_is_shipped() -> None:
    from kvpilot.runtime.eval import EVAL_TEXT, load_text

    text, digest = load_text()
    assert EVAL_TEXT.is_file() and len(text) > 10_000 and len(digest) == 64
    assert "```python" in text  # prose and code
