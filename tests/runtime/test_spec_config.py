"""--speculative-config: vLLM's JSON parsed into SpeculativeConfig; EngineArgs.validate() refuses bad input
with a message naming the problem; the flag reaches the CLI."""

from __future__ import annotations

import argparse

import pytest
from kvpilot.runtime.engine.engine_args import EngineArgs, EngineArgsError
from kvpilot.runtime.engine.spec_decode.config import SpeculativeConfig, SpeculativeConfigError


def test_ngram_and_draft_model_json() -> None:
    ngram = SpeculativeConfig.from_json(
        '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
    )
    assert (ngram.method, ngram.num_speculative_tokens, ngram.prompt_lookup_max, ngram.prompt_lookup_min) == (
        "ngram",
        4,
        4,
        2,
    )
    draft = SpeculativeConfig.from_json('{"model": "/models/small", "num_speculative_tokens": 3}')
    assert (draft.method, draft.model, draft.num_speculative_tokens) == ("draft_model", "/models/small", 3)
    assert SpeculativeConfig.from_json(draft.to_json()) == draft


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"method": "medusa", "num_speculative_tokens": 2}', "'medusa' is not one of"),
        ('{"num_speculative_tokens": 2}', "method None is not one of"),
        (
            '{"method": "ngram", "num_speculative_tokens": 0}',
            "num_speculative_tokens must be an integer >= 1",
        ),
        ('{"method": "ngram", "num_speculative_tokens": "4"}', "num_speculative_tokens must be an integer"),
        ('{"method": "ngram"}', "num_speculative_tokens is required"),
        (
            '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_mx": 3}',
            "unknown key(s) prompt_lookup_mx",
        ),
        (
            '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2, '
            '"prompt_lookup_min": 3}',
            "prompt_lookup_min (3) exceeds prompt_lookup_max (2)",
        ),
        ('{"method": "draft_model", "num_speculative_tokens": 2}', 'needs "model"'),
        (
            '{"method": "ngram", "num_speculative_tokens": 2, "backoff": "no"}',
            "backoff must be true or false",
        ),
        (
            '{"method": "ngram", "num_speculative_tokens": 2, "measure_costs": 1}',
            "measure_costs must be true",
        ),
        (
            '{"method": "ngram", "num_speculative_tokens": 2, "verify_cost_ratio": 0.5}',
            "verify_cost_ratio must be a number >= 1",
        ),
        (
            '{"method": "ngram", "num_speculative_tokens": 2, "probe_overhead": 0}',
            "probe_overhead must be in",
        ),
    ],
)
def test_bad_configs_are_refused_with_a_clear_message(text: str, needle: str) -> None:
    with pytest.raises(SpeculativeConfigError, match=None) as err:
        SpeculativeConfig.from_json(text)
    assert needle in str(err.value)
    with pytest.raises(EngineArgsError) as engine_err:
        EngineArgs(model="m", speculative_config=text).validate()
    assert "--speculative-config" in str(engine_err.value) and needle in str(engine_err.value)


def test_flag_is_generated_and_parsed() -> None:
    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    text = '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4}'
    args = EngineArgs.from_cli(parser.parse_args(["--model", "m", "--speculative-config", text]))
    assert args.speculative_config == text
    assert args.validate() is args
    assert EngineArgs(model="m").speculative_config is None


def test_speculation_with_tensor_or_pipeline_parallel_is_refused_by_name() -> None:
    from kvpilot.runtime.engine.engine_args import EngineArgs

    spec = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
    for sizes in ({"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}):
        problems = EngineArgs(model="m", speculative_config=spec, **sizes).problems()
        assert any("--speculative-config runs on one GPU" in p for p in problems), problems
    assert EngineArgs(model="m", speculative_config=spec).problems() == []
