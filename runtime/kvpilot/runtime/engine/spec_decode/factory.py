"""Building the engine's Speculator from EngineArgs.speculative_config."""

from __future__ import annotations

import dataclasses
from typing import Any

from kvpilot.runtime.engine.engine_args import EngineArgs, EngineArgsError
from kvpilot.runtime.engine.spec_decode.config import DRAFT_MODEL, NGRAM, SpeculativeConfig
from kvpilot.runtime.engine.spec_decode.ngram import NgramProposer
from kvpilot.runtime.engine.spec_decode.speculator import Proposer, Speculator


def build_speculator(args: EngineArgs, target_runner: Any) -> Speculator | None:
    """None without --speculative-config. A draft model gets its own runner (and KV cache of as many
    blocks as the target's) on the target's device, loaded after the target: on CUDA the target's
    --gpu-memory-utilization must leave room for it (the runtime does not shrink the target's cache)."""
    if not args.speculative_config:
        return None
    config = SpeculativeConfig.from_json(args.speculative_config)
    proposer: Proposer
    if config.method == NGRAM:
        proposer = NgramProposer(config.prompt_lookup_max, config.prompt_lookup_min)
    elif config.method == DRAFT_MODEL:
        proposer = _draft_model_proposer(args, config, target_runner)
    else:
        raise EngineArgsError(
            f"--speculative-config method {config.method!r} replays a known continuation: only the "
            "benchmark (benchmarks/bench_spec_decode.py) can build it"
        )
    # verification steps replay CUDA graphs where decode steps do (no-op otherwise)
    target_runner.capture_verify_graphs(
        config.num_speculative_tokens, max(1, min(args.max_num_seqs, config.max_batch_size))
    )
    return Speculator(config, proposer)


def _draft_model_proposer(args: EngineArgs, config: SpeculativeConfig, target_runner: Any) -> Proposer:
    import torch
    from kvpilot.runtime.engine.model_runner import ModelRunner
    from kvpilot.runtime.engine.spec_decode.draft_model import DraftModelProposer

    draft_args = dataclasses.replace(
        args,
        model=str(config.model),
        speculative_config=None,
        max_model_len=target_runner.max_model_len,
        num_kv_blocks=target_runner.num_kv_blocks,
    )
    try:
        runner = ModelRunner(draft_args)
    except torch.OutOfMemoryError as err:
        raise EngineArgsError(
            f"--speculative-config: no memory left for the draft model and its KV cache "
            f"({target_runner.num_kv_blocks} blocks, as many as the target's): lower "
            f"--gpu-memory-utilization (the target's share) or set --num-kv-blocks ({err})"
        ) from None
    target_vocab = target_runner.model_config.vocab_size
    if runner.model_config.vocab_size != target_vocab:
        raise EngineArgsError(
            f"--speculative-config: the draft model's vocabulary ({runner.model_config.vocab_size} tokens) "
            f"differs from the target's ({target_vocab}); a draft model must share the target's tokenizer"
        )
    return DraftModelProposer(runner, max_chunk_tokens=args.max_num_batched_tokens)
