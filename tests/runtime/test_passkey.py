"""The passkey (long-context retrieval) harness on a tiny random checkpoint: prompt construction, the
comparison of KV-cache dtypes against the reference cache, the report and the command line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from kvpilot.runtime.eval.passkey import (
    FILLER,
    HEADER,
    NEEDLE,
    QUESTION,
    build_prompt,
    main,
    make_prompts,
    run_passkey,
)
from kvpilot.runtime.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def ckpt(tiny_checkpoint_factory: Callable[..., Path]) -> Path:
    return tiny_checkpoint_factory("qwen3", seed=5)


def test_prompts_fill_the_context_and_place_the_key_at_its_depth(ckpt: Path) -> None:
    encode = Tokenizer.from_dir(str(ckpt)).encode
    prompts = make_prompts(encode, 300, depths=[0.0, 0.5, 1.0], trials=2, seed=1)
    assert len(prompts) == 6 and len({p.key for p in prompts}) == 6
    for p in prompts:
        assert 250 <= p.num_tokens <= 300  # near the target, never over it
        assert len(p.key) == 5 and p.text.count(p.key) == 2
        needle = NEEDLE.format(key=p.key)
        filler = len(p.text) - len(HEADER) - len(QUESTION) - len(needle)
        where = (p.text.index(needle) - len(HEADER)) / filler  # fraction of the filler before the key
        assert abs(where - p.depth) <= 0.5 * len(FILLER) / filler + 1e-9  # whole filler blocks
    assert make_prompts(encode, 300, depths=[0.5], seed=1)[0] == make_prompts(encode, 300, [0.5], seed=1)[0]
    with pytest.raises(ValueError, match="depth"):
        build_prompt(encode, 300, 1.5, "12345")


def test_a_cache_agrees_with_itself_and_8bit_caches_are_compared(ckpt: Path) -> None:
    report = run_passkey(
        str(ckpt), ["auto", "int8"], context_len=200, depths=[0.0, 1.0], max_tokens=4, num_kv_blocks=64
    )
    assert report.agreement("auto") == 1.0  # the harness itself adds no disagreement
    assert 0.0 <= report.agreement("int8") <= 1.0 and len(report.placements) == 2
    assert all(p.answers["int8"] for p in report.placements)
    table = report.table()
    assert "int8: identical to auto in" in table and "| 1.00 |" in table


def test_command_line_writes_the_json_report(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "passkey.json"
    argv = ["--model", str(ckpt), "--kv-cache-dtype", "fp8", "--context-len", "120", "--depths", "0.5"]
    assert main([*argv, "--max-tokens", "3", "--out", str(out), "num_kv_blocks=32", "device=cpu"]) == 0
    report = json.loads(out.read_text())
    assert set(report["agreement"]) == {"fp8"} and len(report["placements"]) == 1
    assert "fp8: identical to auto" in capsys.readouterr().out


def test_the_answer_is_the_key_given_whatever_follows_it() -> None:
    from kvpilot.runtime.eval.passkey import PasskeyReport, Placement, answer_key

    assert answer_key(" 65125. Remember") == "65125" and answer_key("the pass key. The") is None
    same_key = Placement(0.0, "65125", 100, " 65125.", {"fp8": " 65125. Remember"})
    other_key = Placement(0.5, "73691", 100, " 73691.", {"fp8": " the pass key. The pass"})
    both_none = Placement(1.0, "88892", 100, " a special key", {"fp8": " the pass key"})
    report = PasskeyReport("auto", ["fp8"], [same_key, other_key, both_none])
    assert report.agreement("fp8") == 0.0  # no greedy text is identical ...
    assert report.answer_agreement("fp8") == pytest.approx(2 / 3)  # ... but two answers are the same
    table = report.table()
    assert "same answer: '65125. Remember'" in table and "no: 'the pass key. The pass'" in table
    assert "same answer in 67%" in table
    assert report.to_json()["answer_agreement"] == {"fp8": pytest.approx(2 / 3)}
