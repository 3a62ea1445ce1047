"""Speculative decoding, measured.

CPU (default): the real SmolLM2-135M-Instruct (kvpilot.runtime.default_model), greedy, batch 1, on a
summarization prompt, a code-editing prompt (the answer repeats much of the prompt) and plain chat:
no speculation vs n-gram prompt lookup vs a draft model = SmolLM2 truncated to its first
--draft-layers layers (written to a temporary directory). Prints mean accepted tokens per verification
step (1 + accepted / drafts, vLLM's "mean acceptance length"), acceptance rate, tokens per target
forward, decode tok/s and speed-up, and checks that every run gives exactly the tokens of the plain run.

    python benchmarks/bench_spec_decode.py [--new-tokens 128] [--k 4] [--draft-layers 8] [--repeats 2]

GPU (--gpu): the cost side on the Qwen3-8B shape with random weights (load_format dummy), where no real
drafter is ever accepted: a drafter replaying the target's own greedy continuation (100% acceptance)
and one always wrong (0%), with the back-off policy off ("before back-off") and on, at batch 1, 8 and
64 (prompts of 1024 tokens, 256 out), against no speculation; then the speed-up predicted at the
acceptance rates given by --acceptance (the CPU table's). Verification steps replay CUDA graphs of k + 1
query rows per sequence (--eager-verify: the eager path, for comparison). The verify/decode step ratio
is derived from the 100% run; "engine c" is the ratio the back-off's cost model measured itself (host
step times) in the 0%-with-back-off run. Logs go to $OUT (or --out) as JSON.

    . benchmarks/gpu_env.sh && python benchmarks/bench_spec_decode.py --gpu --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

SUMMARY_TEXT = (
    "The city council met on Tuesday to discuss the new public library. The library will be built on the "
    "site of the old train station, near the river. It will have three floors, a children's reading room, "
    "a cafe, and a large hall for concerts and lectures. The council expects construction to start next "
    "spring and to finish within two years. The project will cost about twelve million dollars, most of "
    "which will come from a state grant. Some residents worry about traffic and parking near the river, "
    "and the council promised to add a new parking garage and a bus stop. The library director said the "
    "new building will double the number of books and computers available to the public."
)
CODE_TEXT = """def summarize(orders):
    total = 0
    count = 0
    for order in orders:
        if order.status == "paid":
            total += order.amount
            count += 1
    average = total / count if count else 0
    return {"total": total, "count": count, "average": average}
"""
PROMPTS = {
    "summarization": f"{SUMMARY_TEXT}\n\nSummarize the text above, reusing its wording.",
    "code editing": f"{CODE_TEXT}\nRename the variable `total` to `paid_total` in this function and "
    "print the whole updated function.",
    "chat": "What are some good habits for staying healthy?",
}


# ---- CPU: the real model ----------------------------------------------------------------------------
def truncated_copy(model_dir: Path, layers: int, root: Path) -> Path:
    """A copy of `model_dir` keeping only its first `layers` decoder layers (same embeddings, norm, head)."""
    from safetensors.torch import load_file, save_file

    out = root / f"draft-{layers}-layers"
    out.mkdir(parents=True, exist_ok=True)
    for item in model_dir.iterdir():  # tokenizer and generation files as they are
        skip = item.suffix == ".safetensors" or item.name in ("config.json", "model.safetensors.index.json")
        if item.is_file() and not skip:
            shutil.copy(item, out / item.name)
    config = json.loads((model_dir / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (out / "config.json").write_text(json.dumps(config, indent=2))
    weights: dict[str, Any] = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        for name, tensor in load_file(shard).items():
            parts = name.split(".")
            if len(parts) > 2 and parts[1] == "layers" and int(parts[2]) >= layers:
                continue
            weights[name] = tensor
    save_file(weights, out / "model.safetensors")
    return out


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    ids: list[int] = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]))
    return ids


def timed_generate(engine: Any, prompt: list[int], new_tokens: int) -> dict[str, Any]:
    from kvpilot.runtime.sampling_params import SamplingParams

    before = engine.stats().spec_decode
    engine.add_request("r", prompt, SamplingParams(temperature=0.0, max_tokens=new_tokens, detokenize=False))
    tokens: list[int] = []
    steps, first = 0, None
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens += out.new_token_ids
            if first is None and out.new_token_ids:
                first = time.perf_counter()
        steps += 1
    end = time.perf_counter()
    after = engine.stats().spec_decode
    row: dict[str, Any] = {
        "tokens": tokens,
        "decode_s": end - (first or end),
        "steps": steps,
        "decode_tok_s": (len(tokens) - 1) / max(end - (first or end), 1e-9),
    }
    if before is not None and after is not None:
        row["drafts"] = after.num_drafts - before.num_drafts
        row["draft_tokens"] = after.num_draft_tokens - before.num_draft_tokens
        row["accepted"] = after.num_accepted_tokens - before.num_accepted_tokens
    return row


def cpu_engine(model: Path, spec: str | None) -> Any:
    from kvpilot.runtime.engine.engine_args import EngineArgs
    from kvpilot.runtime.engine.llm_engine import LLMEngine

    return LLMEngine.from_args(
        EngineArgs(model=str(model), max_model_len=2048, device="cpu", speculative_config=spec)
    )


def run_cpu(args: argparse.Namespace) -> list[dict[str, Any]]:
    from kvpilot.runtime.default_model import smollm2_gguf
    from kvpilot.runtime.gguf_model import resolve_model_dir

    model = resolve_model_dir(smollm2_gguf())
    root = Path(tempfile.mkdtemp(prefix="kvpilot-draft-"))
    draft = truncated_copy(model, args.draft_layers, root)
    print(f"draft model: {model.name} truncated to {args.draft_layers} layers, written to {draft}")
    ngram = json.dumps(
        {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    )
    drafted = json.dumps({"model": str(draft), "num_speculative_tokens": args.k})
    configs = {"none": None, "ngram": ngram, "draft": drafted}
    engines = {m: cpu_engine(model, configs[m]) for m in ("none", *args.methods)}
    tokenizer = engines["none"].tokenizer
    rows = []
    for name, text in PROMPTS.items():
        prompt = chat_ids(tokenizer, text)
        best: dict[str, dict[str, Any]] = {}
        for _ in range(args.repeats):  # interleaved, best of: the machine is shared
            for method, engine in engines.items():
                row = timed_generate(engine, prompt, args.new_tokens)
                if method not in best or row["decode_tok_s"] > best[method]["decode_tok_s"]:
                    best[method] = row
        base = best["none"]
        for method, row in best.items():
            same = row["tokens"] == base["tokens"]
            drafts = row.get("drafts", 0)
            rows.append(
                {
                    "prompt": name,
                    "method": method,
                    "prompt_tokens": len(prompt),
                    "output_tokens": len(row["tokens"]),
                    "mean_accepted_per_step": 1 + row["accepted"] / drafts if drafts else None,
                    "acceptance_rate": row["accepted"] / row["draft_tokens"]
                    if row.get("draft_tokens")
                    else None,
                    "tokens_per_forward": len(row["tokens"]) / row["steps"],
                    "decode_tok_s": row["decode_tok_s"],
                    "speedup": row["decode_tok_s"] / base["decode_tok_s"],
                    "same_tokens": same,
                }
            )
    shutil.rmtree(root, ignore_errors=True)
    return rows


CPU_HEADER = (
    "| prompt | method | out tokens | mean accepted / step | acceptance | tokens / forward | decode tok/s "
    "| speed-up | same tokens |"
)


def print_cpu(rows: list[dict[str, Any]]) -> None:
    print(CPU_HEADER)
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mean = f"{r['mean_accepted_per_step']:.2f}" if r["mean_accepted_per_step"] else "—"
        rate = f"{r['acceptance_rate']:.0%}" if r["acceptance_rate"] is not None else "—"
        cells = [
            r["prompt"],
            r["method"],
            str(r["output_tokens"]),
            mean,
            rate,
            f"{r['tokens_per_forward']:.2f}",
            f"{r['decode_tok_s']:.1f}",
            f"{r['speedup']:.2f}×",
            str(r["same_tokens"]),
        ]
        print("| " + " | ".join(cells) + " |")


# ---- GPU: the cost side ----------------------------------------------------------------------------
def gpu_requests(batch: int, vocab: int, prompt_len: int, out_len: int) -> list[tuple[list[int], int]]:
    rng = random.Random(batch)
    low, high = min(1000, vocab // 4), max(vocab - 1000, vocab // 2)
    return [([rng.randrange(low, high) for _ in range(prompt_len)], out_len) for _ in range(batch)]


def gpu_run(engine: Any, reqs: list[tuple[list[int], int]], tag: str) -> dict[str, Any]:
    from kvpilot.runtime.bench import run_ours

    before = engine.stats().spec_decode
    result = run_ours(engine, reqs, tag)
    # decode tokens per second of the batch: prefill excluded (each request's time per output token)
    result["decode_tok_s"] = len(reqs) / result["tpot_s"] if result["tpot_s"] else float("nan")
    after = engine.stats().spec_decode
    if before is not None and after is not None:
        drafted = after.num_draft_tokens - before.num_draft_tokens
        accepted = after.num_accepted_tokens - before.num_accepted_tokens
        drafts = after.num_drafts - before.num_drafts
        result["acceptance"] = accepted / drafted if drafted else 0.0
        result["tokens_per_verify"] = 1 + accepted / drafts if drafts else 1.0  # per sequence and step
        result["drafts"] = drafts  # sequences x verification steps
        result["verify_steps"] = engine.speculator.num_verify_steps
    return result


def timed_runner_steps(engine: Any, reqs: list[tuple[list[int], int]], tag: str) -> dict[str, Any]:
    """gpu_run, with the runner's step timed to its end on the device (a synchronize after each call).
    Only for runs whose every step is a verification step (the verifier reads the logits back right
    after the runner call anyway): the rest of the step time is host work around it."""
    import torch

    runner, calls, spent = engine.runner, [0], [0.0]
    real = runner.execute

    def execute(*a: Any, **kw: Any) -> Any:
        started = time.perf_counter()
        out = real(*a, **kw)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        spent[0] += time.perf_counter() - started
        calls[0] += 1
        return out

    runner.execute = execute
    try:
        result = gpu_run(engine, reqs, tag)
    finally:
        del runner.execute  # the bound method again
    result["runner_step_s"] = spent[0] / max(calls[0], 1)
    return result


def continuations(engine: Any, reqs: list[tuple[list[int], int]]) -> dict[tuple[int, ...], list[int]]:
    from kvpilot.runtime.sampling_params import SamplingParams

    for i, (prompt, out_len) in enumerate(reqs):
        engine.add_request(
            f"c{i}",
            prompt,
            SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True, detokenize=False),
        )
    outputs: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
    return {tuple(prompt): outputs[f"c{i}"] for i, (prompt, _) in enumerate(reqs)}


def run_gpu(args: argparse.Namespace) -> dict[str, Any]:
    from kvpilot.runtime.bench import build_engine
    from kvpilot.runtime.bench_workloads import WORKLOADS, write_model_dir
    from kvpilot.runtime.engine.spec_decode.config import SpeculativeConfig
    from kvpilot.runtime.engine.spec_decode.oracle import OracleProposer
    from kvpilot.runtime.engine.spec_decode.policy import expected_tokens_per_step
    from kvpilot.runtime.engine.spec_decode.speculator import Speculator

    root = Path(tempfile.mkdtemp(prefix="kvpilot-spec-"))
    model = write_model_dir(root, "qwen3-8b")
    settings = argparse.Namespace(
        max_num_seqs=64, max_num_batched_tokens=8192, engine=[], quantization="none", kv_cache_dtype="auto"
    )
    engine = build_engine(model, WORKLOADS["W3"], settings)
    if not args.eager_verify:
        started = time.perf_counter()
        engine.runner.capture_verify_graphs(args.k, max(args.batches))
        print(f"verify graphs (k={args.k}) captured in {time.perf_counter() - started:.1f} s", flush=True)
    vocab = engine.runner.model_config.vocab_size
    results: dict[str, Any] = {"k": args.k, "verify_graphs": not args.eager_verify, "batches": {}}
    always = {"max_batch_size": 1 << 30, "backoff": False}  # speculate k every step, any batch
    for batch in args.batches:
        reqs = gpu_requests(batch, vocab, args.prompt_len, args.gpu_new_tokens)
        known = continuations(engine, reqs)
        # In bf16 a verification step's logits differ from a decode step's by rounding, so on random
        # weights' near-tied logits the speculating engine's greedy tokens drift from the plain run's; a
        # replay of the plain run then stops matching. Each refine pass replays the previous tokens
        # through the speculating engine and keeps what it produced: the drift moves later each pass.
        for _ in range(args.refine):
            config = SpeculativeConfig.from_dict(
                {"method": "replay", "num_speculative_tokens": args.k, **always}
            )
            engine.speculator = Speculator(config, OracleProposer(known, wrong=False, vocab_size=vocab))
            known = continuations(engine, reqs)
        engine.speculator = None
        row = {"none": gpu_run(engine, reqs, f"none{batch}")}
        variants = {
            "replay": (False, always),
            "wrong, no back-off": (True, always),
            "wrong, back-off": (True, {}),
        }
        for name, (wrong, knobs) in variants.items():
            config = SpeculativeConfig.from_dict(
                {"method": "wrong" if wrong else "replay", "num_speculative_tokens": args.k, **knobs}
            )
            engine.speculator = Speculator(config, OracleProposer(known, wrong=wrong, vocab_size=vocab))
            measure = timed_runner_steps if name == "wrong, no back-off" else gpu_run
            row[name] = measure(engine, reqs, f"{name}{batch}")
            row[name]["engine_cost_ratio"] = engine.speculator.costs.ratios(batch, args.k)[-1]
            row[name]["cost_times_s"] = {str(key): t for key, t in engine.speculator.costs.times.items()}
            row[name]["verify_step_s"] = engine.speculator.costs.mean(batch, args.k)
        engine.speculator = None
        results["batches"][batch] = row
        # a verification step's time relative to a plain decode step: the replay run's mean verify step
        # (host wall time, drafting and output included) over the plain run's time per token (one step);
        # without that measurement, from the throughputs as if every draft had been accepted
        verify_s, decode_s = row["replay"]["verify_step_s"], row["none"]["tpot_s"]
        if verify_s and decode_s:
            ratio = verify_s / decode_s
        else:
            ratio = (args.k + 1) * row["none"]["decode_tok_s"] / row["replay"]["decode_tok_s"]
        row["verify_step_over_decode_step"] = ratio
        row["predicted_speedup"] = {
            str(a): expected_tokens_per_step(a, args.k) / ratio for a in (1.0, *args.acceptance)
        }
        print_gpu_row(batch, row, args)
    shutil.rmtree(root, ignore_errors=True)
    return results


def print_gpu_row(batch: int, row: dict[str, Any], args: argparse.Namespace) -> None:
    base = row["none"]["decode_tok_s"]
    cells = [
        f"{row[n]['decode_tok_s']:.0f} ({row[n]['decode_tok_s'] / base:.2f}×)"
        for n in ("replay", "wrong, no back-off", "wrong, back-off")
    ]
    replay = row["replay"]
    cells[0] += f", a={replay['acceptance']:.2f}, {replay['tokens_per_verify']:.2f} tok/step"
    # tokens per sequence if every step had verified drafts at this rate, vs what was generated: a replay
    # that drifted off its continuation (bf16 near-ties) proposes nothing afterwards and runs plain steps
    per_seq = replay["output_tokens"] / batch
    verified = replay["verify_steps"] * replay["tokens_per_verify"]
    cells[0] += f", {replay['verify_steps']} verify steps ({min(verified / per_seq, 1.0):.0%} of the tokens)"
    predicted = ", ".join(f"a={a}: {v:.2f}×" for a, v in row["predicted_speedup"].items())
    ratio = row["verify_step_over_decode_step"]
    engine_c = row["wrong, back-off"]["engine_cost_ratio"]
    wrong = row["wrong, no back-off"]
    print(
        f"batch {batch}: verify step {1e3 * (wrong['verify_step_s'] or 0):.2f} ms of which the runner "
        f"(to the device's end) {1e3 * wrong['runner_step_s']:.2f} ms; plain decode step "
        f"{1e3 * row['none']['tpot_s']:.2f} ms; 0% with back-off: {row['wrong, back-off']['drafts']} drafts "
        f"({batch} per verification step), cost times {row['wrong, back-off']['cost_times_s']}",
        flush=True,
    )
    print(
        f"| {batch} | {base:.0f} | {' | '.join(cells)} | {ratio:.2f} | {engine_c:.2f} | {predicted} |",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpu", action="store_true", help="the cost side on the Qwen3-8B shape (CUDA)")
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--new-tokens", type=int, default=128, help="CPU: tokens generated per prompt")
    parser.add_argument("--draft-layers", type=int, default=8, help="CPU: layers kept in the draft model")
    parser.add_argument("--repeats", type=int, default=2, help="CPU: interleaved runs, best kept")
    parser.add_argument(
        "--methods", nargs="+", default=["ngram", "draft"], choices=["ngram", "draft"], help="CPU: methods"
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64], help="GPU: batch sizes")
    parser.add_argument("--prompt-len", type=int, default=1024, help="GPU: prompt tokens")
    parser.add_argument("--gpu-new-tokens", type=int, default=256, help="GPU: output tokens")
    parser.add_argument(
        "--acceptance", type=float, nargs="+", default=[0.3, 0.5, 0.7, 0.9], help="GPU: rates to predict for"
    )
    parser.add_argument(
        "--refine",
        type=int,
        default=1,
        help="GPU: replay passes that re-derive the continuation (see run_gpu)",
    )
    parser.add_argument(
        "--eager-verify", action="store_true", help="GPU: verification steps eagerly (no verify graphs)"
    )
    parser.add_argument("--out", default=os.environ.get("OUT"), help="directory for the JSON log")
    args = parser.parse_args(argv)
    if args.gpu:
        print(
            "| batch | none decode tok/s | replay (100% unless bf16 drift) | 0%, no back-off | 0%, back-off "
            "| verify/decode step | engine c "
            f"| predicted speed-up (k={args.k}) |"
        )
        print("|---|---|---|---|---|---|---|---|")
        result: Any = run_gpu(args)
    else:
        result = run_cpu(args)
        print_cpu(result)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        name = "spec_decode_gpu.json" if args.gpu else "spec_decode_cpu.json"
        (Path(args.out) / name).write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
