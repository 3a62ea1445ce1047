"""Long-context retrieval check for KV-cache dtypes: a passkey hidden at several depths of filler text.

Each prompt is filler text ("The grass is green. The sky is blue. ...", as in the passkey test of
Mohtashami & Jaggi) of about `context_len` tokens with one line holding a random 5-digit pass key at a given
depth (0 = the start, 1 = just before the question), ending in "What is the pass key? The pass key is".
Every prompt is answered greedily with the reference KV cache (the 16-bit one by default) and with each
cache under test, in one run; the report gives, per placement, both answers, whether they are identical,
and whether each contains the key. The gate for an 8-bit cache is agreement with the reference, not the
model's own retrieval accuracy: reported both strictly (the whole greedy text identical) and by answer
(the same 5-digit key given, or none by both; the words a small model adds after the key flip at near-ties
of its logits, which says nothing about retrieval).

    python -m kvpilot.runtime.eval.passkey --model DIR --kv-cache-dtype fp8 int8 --context-len 2000 \\
        [--depths 0,0.25,0.5,0.75,1] [--trials 2] [--out passkey.json] [engine flags as name=value ...]

Works with any model directory the runtime loads (tiny random checkpoints in tests, where only agreement
means anything).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
HEADER = (
    "There is an important piece of information hidden inside a lot of irrelevant text. Find it and "
    "memorize it. I will quiz you about it.\n"
)
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "\nWhat is the pass key? The pass key is"
DEFAULT_DEPTHS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_KEY = re.compile(r"\d{5}")


def answer_key(text: str) -> str | None:
    """The answer to the question: the first 5-digit number of the greedy text, or None (no key given).
    Two caches that give the same key (or both none) answered alike, whatever words follow it."""
    found = _KEY.search(text)
    return found.group() if found else None


@dataclass(frozen=True)
class PasskeyPrompt:
    text: str
    key: str
    depth: float  # requested: fraction of the filler before the needle
    num_tokens: int  # as the model's tokenizer counts them


def build_prompt(
    encode: Callable[[str], list[int]], context_len: int, depth: float, key: str
) -> PasskeyPrompt:
    """The longest prompt of whole filler sentences, needle at `depth`, that fits context_len tokens."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    fixed = len(encode(HEADER + NEEDLE.format(key=key) + QUESTION))
    per_filler = max(1, len(encode(FILLER * 8)) // 8)
    repeats = max(0, (context_len - fixed) // per_filler)
    while True:
        before = round(repeats * depth)
        text = HEADER + FILLER * before + NEEDLE.format(key=key) + FILLER * (repeats - before) + QUESTION
        n = len(encode(text))
        if n <= context_len or repeats == 0:
            return PasskeyPrompt(text, key, depth, n)
        repeats -= max(1, (n - context_len) // per_filler)


def make_prompts(
    encode: Callable[[str], list[int]],
    context_len: int,
    depths: Sequence[float] = DEFAULT_DEPTHS,
    trials: int = 1,
    seed: int = 0,
) -> list[PasskeyPrompt]:
    """trials prompts per depth, each with its own random 5-digit key (seeded)."""
    rng = random.Random(seed)
    return [
        build_prompt(encode, context_len, d, str(rng.randint(10000, 99999)))
        for d in depths
        for _ in range(trials)
    ]


@dataclass
class Placement:
    depth: float
    key: str
    prompt_tokens: int
    reference: str
    answers: dict[str, str] = field(default_factory=dict)  # kv dtype -> answer text

    def agrees(self, kv: str) -> bool:
        """The whole greedy text is identical (the strict comparison)."""
        return self.answers[kv] == self.reference

    def same_answer(self, kv: str) -> bool:
        """The same key given (or none by both): the retrieval outcome, not the words after it."""
        return answer_key(self.answers[kv]) == answer_key(self.reference)

    def found(self, answer: str) -> bool:
        return self.key in answer


@dataclass
class PasskeyReport:
    reference_dtype: str
    dtypes: list[str]
    placements: list[Placement]

    def agreement(self, kv: str) -> float:
        return sum(p.agrees(kv) for p in self.placements) / max(1, len(self.placements))

    def answer_agreement(self, kv: str) -> float:
        return sum(p.same_answer(kv) for p in self.placements) / max(1, len(self.placements))

    def accuracy(self, kv: str | None = None) -> float:
        """Fraction of answers holding the key (kv None: the reference's)."""
        answers = [p.reference if kv is None else p.answers[kv] for p in self.placements]
        hits = sum(p.found(a) for p, a in zip(self.placements, answers, strict=True))
        return hits / max(1, len(self.placements))

    def table(self) -> str:
        head = ["depth", "tokens", "key", f"{self.reference_dtype} answer"]
        head += [f"{kv} same" for kv in self.dtypes]
        rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for p in self.placements:
            cells = [f"{p.depth:.2f}", str(p.prompt_tokens), p.key, repr(p.reference.strip())]
            cells += [_verdict(p, kv) for kv in self.dtypes]
            rows.append("| " + " | ".join(cells) + " |")
        summary = [f"{self.reference_dtype}: key found {100 * self.accuracy():.0f}%"]
        summary += [
            f"{kv}: identical to {self.reference_dtype} in {100 * self.agreement(kv):.0f}% of "
            f"{len(self.placements)} placements, same answer in {100 * self.answer_agreement(kv):.0f}%, "
            f"key found {100 * self.accuracy(kv):.0f}%"
            for kv in self.dtypes
        ]
        return "\n".join([*rows, "", *summary])

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["agreement"] = {kv: self.agreement(kv) for kv in self.dtypes}
        out["answer_agreement"] = {kv: self.answer_agreement(kv) for kv in self.dtypes}
        out["accuracy"] = {kv: self.accuracy(kv) for kv in self.dtypes} | {
            f"{self.reference_dtype} (reference)": self.accuracy()
        }
        return out


def _verdict(p: Placement, kv: str) -> str:
    if p.agrees(kv):
        return "yes"
    prefix = "same answer" if p.same_answer(kv) else "no"
    return f"{prefix}: {p.answers[kv].strip()!r}"


def _answers(model: str, kv_cache_dtype: str, prompts: list[str], max_tokens: int, engine: dict) -> list[str]:
    """Greedy answers with one KV-cache dtype; the engine is dropped before returning (one at a time)."""
    from kvpilot.runtime import LLM, SamplingParams

    llm = LLM(model, kv_cache_dtype=kv_cache_dtype, **engine)
    try:
        outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0))
        return [o.text for o in outs]
    finally:
        del llm
        gc.collect()
        _empty_device_cache()


def _empty_device_cache() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_passkey(
    model: str,
    dtypes: Sequence[str],
    *,
    context_len: int,
    depths: Sequence[float] = DEFAULT_DEPTHS,
    trials: int = 1,
    reference_dtype: str = "auto",
    max_tokens: int = 8,
    seed: int = 0,
    **engine: Any,
) -> PasskeyReport:
    """Prompts near context_len tokens (max_model_len is set to hold them plus the answer), answered with
    the reference cache and then each dtype; engine: further EngineArgs fields."""
    from kvpilot.runtime.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(model)
    prompts = make_prompts(tokenizer.encode, context_len, depths, trials, seed)
    engine.setdefault("max_model_len", max(p.num_tokens for p in prompts) + max_tokens)
    texts = [p.text for p in prompts]
    reference = _answers(model, reference_dtype, texts, max_tokens, engine)
    placements = [
        Placement(p.depth, p.key, p.num_tokens, ref) for p, ref in zip(prompts, reference, strict=True)
    ]
    for kv in dtypes:
        for place, answer in zip(placements, _answers(model, kv, texts, max_tokens, engine), strict=True):
            place.answers[kv] = answer
    return PasskeyReport(reference_dtype, list(dtypes), placements)


def _engine_value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model directory (or anything LLM loads)")
    parser.add_argument("--kv-cache-dtype", nargs="+", default=["fp8", "int8"], help="caches under test")
    parser.add_argument("--reference", default="auto", help="reference KV-cache dtype (auto: the model's)")
    parser.add_argument("--context-len", type=int, required=True, help="prompt length in tokens (at most)")
    parser.add_argument("--depths", default=",".join(str(d) for d in DEFAULT_DEPTHS))
    parser.add_argument("--trials", type=int, default=1, help="prompts (keys) per depth")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="JSON report")
    parser.add_argument("engine", nargs="*", help="EngineArgs fields as name=value (device=cuda ...)")
    args = parser.parse_args(argv)
    engine = {k: _engine_value(v) for k, v in (e.split("=", 1) for e in args.engine)}
    report = run_passkey(
        args.model,
        args.kv_cache_dtype,
        context_len=args.context_len,
        depths=[float(d) for d in args.depths.split(",")],
        trials=args.trials,
        reference_dtype=args.reference,
        max_tokens=args.max_tokens,
        seed=args.seed,
        **engine,
    )
    print(report.table())
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report.to_json(), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
