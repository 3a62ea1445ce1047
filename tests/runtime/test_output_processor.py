"""The HTTP process's text side (server/output_processor.py) agrees with the engine's own (RequestState).

The same scripted fake model runs twice: once with the engine detokenizing and matching stop strings
(how the offline LLM runs), once as the engine core runs it for the server (token ids only, no stop
strings) with RequestText turning its outputs into text, and a stop string found there aborting the
request in the engine. Text, finish and stop reasons and token counts must be identical.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from kvpilot.runtime.engine_core.core import token_output
from kvpilot.runtime.sampling_params import SamplingParams
from kvpilot.runtime.server.output_processor import RequestText

from tests.runtime.fake_model import EOS_TOKEN_ID
from tests.runtime.test_stop import STOPS, TOK, WORDS, random_tokenization, scripted_engine


def random_case(rng: random.Random) -> tuple[list[int], SamplingParams]:
    words = [rng.choice(WORDS) for _ in range(rng.randint(2, 12))]
    for _ in range(rng.randint(0, 2)):
        words.insert(rng.randint(0, len(words)), rng.choice([*STOPS, "ST", "é", "#"]))
    ids = random_tokenization("".join(words), rng)
    if rng.random() < 0.3:  # an EOS inside the script
        ids.insert(rng.randint(0, len(ids)), EOS_TOKEN_ID)
    params = SamplingParams(
        max_tokens=rng.randint(1, len(ids) + 3),
        stop=rng.sample(STOPS, rng.randint(0, 2)),
        stop_token_ids=[rng.choice(ids)] if rng.random() < 0.3 else [],
        ignore_eos=rng.random() < 0.3,
        min_tokens=rng.choice([0, 0, 2, 5]),
        include_stop_str_in_output=rng.random() < 0.5,
        skip_special_tokens=rng.random() < 0.8,
        logprobs=rng.choice([None, None, 1]),
    )
    return ids, params


@pytest.mark.parametrize("seed", range(4))
def test_http_side_text_equals_the_engines(seed: int) -> None:
    rng = random.Random(seed)
    cases = {k: random_case(rng) for k in range(1, 41)}
    scripts = {k: ids for k, (ids, _) in cases.items()}

    reference = scripted_engine(scripts)
    for k, (_, params) in cases.items():
        reference.add_request(str(k), [k], params)
    want_text: dict[str, str] = {}
    want_final = {}
    while reference.has_unfinished_requests():
        for out in reference.step():
            want_text[out.request_id] = want_text.get(out.request_id, "") + out.new_text
            if out.finished:
                want_final[out.request_id] = out

    core = scripted_engine(scripts)
    texts = {}
    for k, (_, params) in cases.items():
        core.add_request(
            str(k), [k], replace(params, stop=[], include_stop_str_in_output=False, detokenize=False)
        )
        texts[str(k)] = RequestText(TOK, [k], params)
    got_text: dict[str, str] = {}
    got_final = {}
    while core.has_unfinished_requests():
        for out in core.step():
            delta = texts[out.request_id].process(token_output(out))
            if delta is None:
                continue
            got_text[out.request_id] = got_text.get(out.request_id, "") + delta.new_text
            if delta.finished:
                got_final[out.request_id] = delta
            if delta.stopped_by_string:
                core.abort_request(out.request_id)

    for rid, want in want_final.items():
        got = got_final[rid]
        assert got_text.get(rid, "") == want_text.get(rid, ""), cases[int(rid)]
        assert (got.finish_reason, got.stop_reason, got.num_output_tokens) == (
            want.finish_reason,
            want.stop_reason,
            want.num_output_tokens,
        ), cases[int(rid)]
    assert set(got_final) == set(want_final)
