"""CPU speed on the real SmolLM2-135M-Instruct: kvpilot against Hugging Face transformers' `generate`, same
model, same prompt, same run.

    python benchmarks/bench_cpu_real_model.py [--dtype float32|bfloat16] [--new-tokens 128] [--repeats 3]

Measured, greedy with EOS ignored so every run makes exactly --new-tokens tokens:
  single stream  decode tok/s of one request: (new_tokens - 1) / (time to the last token - time to the
                 first), so the prompt's prefill is not counted (transformers: a generate of new_tokens
                 minus a generate of 1 token, on the same prompt)
  8 streams      output tok/s of 8 requests with different prompts submitted together (kvpilot: continuous
                 batching; transformers: one padded batch of 8, for reference)
Each figure is the best of --repeats interleaved runs (the machine may be shared). Threads: torch's
default (one per core) unless --threads.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how photosynthesis works to a ten-year-old.",
    "List five tips for learning a new programming language.",
    "Describe the water cycle in a few paragraphs.",
    "What are the main differences between cats and dogs as pets?",
    "Write a recipe for a simple loaf of bread.",
    "Summarize the history of the printing press.",
    "Give advice to someone starting their first job.",
]


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]))


class KvpilotRunner:
    def __init__(self, model_dir: str, dtype: str, new: int) -> None:
        from kvpilot.runtime.llm import LLM
        from kvpilot.runtime.sampling_params import SamplingParams

        self.llm = LLM(model_dir, device="cpu", dtype=dtype, max_model_len=1024, enable_prefix_caching=False)
        tokenizer = self.llm.get_tokenizer()
        self.prompts = [chat_ids(tokenizer, p) for p in PROMPTS]
        self.new = new
        self.params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True, detokenize=False)
        self.llm.generate(self.prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))

    def single(self) -> float:
        """Seconds per decoded token of one request (after its first token)."""
        engine, times = self.llm.engine, []
        engine.add_request("single", self.prompts[0], self.params)
        while engine.has_unfinished_requests():
            if engine.step():
                times.append(time.perf_counter())
        return (times[-1] - times[0]) / (self.new - 1)

    def streams8(self) -> float:
        """Seconds per output token of 8 requests together (prefill included)."""
        start = time.perf_counter()
        outs = self.llm.generate(self.prompts, self.params)
        assert all(len(o.token_ids) == self.new for o in outs)
        return (time.perf_counter() - start) / (self.new * len(self.prompts))


class TransformersRunner:
    def __init__(self, model_dir: str, dtype: str, new: int) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer.padding_side = "left"
        self.prompts = [
            self.tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
            )
            for p in PROMPTS
        ]
        self.new = new
        self.generate(self.prompts[:1], 4)  # warm-up

    def generate(self, texts: list[str], tokens: int) -> float:
        inputs = self.tokenizer(texts, return_tensors="pt", padding=True)
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                **inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=2
            )
        assert out.shape[1] - inputs["input_ids"].shape[1] == tokens
        return time.perf_counter() - start

    def single(self) -> float:
        return (self.generate(self.prompts[:1], self.new) - self.generate(self.prompts[:1], 1)) / (
            self.new - 1
        )

    def streams8(self) -> float:
        return self.generate(self.prompts, self.new) / (self.new * len(self.prompts))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="model directory or .gguf (default: the built-in SmolLM2)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int)
    p.add_argument("--skip-transformers", action="store_true")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from kvpilot.runtime.default_model import smollm2_gguf
    from kvpilot.runtime.gguf_model import resolve_model_dir

    model_dir = str(resolve_model_dir(args.model or smollm2_gguf()))
    runners: dict[str, Any] = {"kvpilot": KvpilotRunner(model_dir, args.dtype, args.new_tokens)}
    if not args.skip_transformers:
        runners["transformers"] = TransformersRunner(model_dir, args.dtype, args.new_tokens)
    best: dict[str, dict[str, float]] = {name: {} for name in runners}
    for _ in range(args.repeats):  # interleaved, best of each: the machine may be shared
        for name, runner in runners.items():
            for what in ("single", "streams8"):
                seconds = getattr(runner, what)()
                best[name][what] = min(best[name].get(what, seconds), seconds)
    result: dict[str, Any] = {
        "model": model_dir,
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
    }
    for name, seconds in best.items():
        result[name] = {"single_tok_s": 1 / seconds["single"], "streams8_tok_s": 1 / seconds["streams8"]}
    if "transformers" in result:
        ours, theirs = result["kvpilot"], result["transformers"]
        result["single_ratio"] = ours["single_tok_s"] / theirs["single_tok_s"]
        result["streams8_vs_transformers_single"] = ours["streams8_tok_s"] / theirs["single_tok_s"]
        result["streams8_ratio"] = ours["streams8_tok_s"] / theirs["streams8_tok_s"]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
