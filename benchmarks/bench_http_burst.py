"""W1 through HTTP: a burst of streaming /v1/completions requests, sent all at once to `kvpilot-runtime`.

    python benchmarks/bench_http_burst.py [options] -- RUNTIME_ARGS...
    python benchmarks/bench_http_burst.py --mode both --out burst.json -- --model DIR --load-format dummy \
        --device cuda --dtype bfloat16 --max-model-len 4096 --no-enable-prefix-caching

It starts the server with RUNTIME_ARGS (plus --host/--port/--served-model-name and a waiting-queue bound
large enough for the burst), warms it up, sends N streaming requests at the same instant (default 256;
prompts are random token ids, input and output lengths uniform in [100, 1024], ignore_eos, greedy,
seeded: the same requests as `python -m kvpilot.runtime.bench --workloads W1` for a vocabulary of more
than 4000 tokens), and reports output tok/s, TTFT p50/p99, ITL p50/p99 (gaps between a stream's
content events), e2e p50 and SSE content events per output token, as a table and as JSON (--out).

--mode engine runs the same requests on an in-process LLMEngine built from the same RUNTIME_ARGS, all
added at once, and measures the same numbers at engine level (each step's output of a request counts as
one event); --mode both runs that first, in a child process (so its device memory is released), then
the HTTP burst, and adds the ratio. The client can be split over several processes (--client-procs)
so that it is not what limits the measurement; all of them start at one shared instant.

--write-model-dir DIR writes a model directory whose tokenizer gives every token id a word: of a real
shape (--shape, for --load-format dummy) or with the weights of a checkpoint (--weights-from). Not a test:
numbers go to BENCHMARKS.md by hand. A CPU smoke run with the tiny fixture checkpoint:
    python -m kvpilot.runtime.fixtures /tmp/tiny
    python benchmarks/bench_http_burst.py --write-model-dir /tmp/tiny-words --weights-from /tmp/tiny
    OMP_NUM_THREADS=1 python benchmarks/bench_http_burst.py --mode both -n 64 --input-len 16 128 \
        --output-len 16 128 -- --model /tmp/tiny-words --device cpu --max-model-len 512 --num-kv-blocks 4096
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

W1_VOCAB_LOW = 1000  # kvpilot.runtime.bench.make_requests draws ids from [1000, vocab - 1000)
STARTUP_TIMEOUT_S = 900.0


# ---- requests ---------------------------------------------------------------------------------------
def vocab_size(runtime_args: list[str]) -> int:
    model = Path(_flag_value(runtime_args, "--model") or "")
    config = json.loads((model / "config.json").read_text())
    return int(config["vocab_size"])


def _flag_value(argv: list[str], flag: str) -> str | None:
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def make_requests(
    num: int, input_len: tuple[int, int], output_len: tuple[int, int], vocab: int, seed: int
) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) pairs; for a vocabulary > 4000 exactly bench.make_requests' W1 draws."""
    low = W1_VOCAB_LOW if vocab > 4 * W1_VOCAB_LOW else 4
    rng = random.Random(seed)
    reqs = []
    for _ in range(num):
        n_in = rng.randint(*input_len)
        reqs.append(([rng.randrange(low, vocab - low) for _ in range(n_in)], rng.randint(*output_len)))
    return reqs


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(records: list[dict[str, Any]], start: float) -> dict[str, Any]:
    """records: per request {sent, events: [t...], tokens, finish_reason, error}."""
    done = [r for r in records if r["events"]]
    end = max((r["events"][-1] for r in done), default=start)
    tokens = sum(r["tokens"] for r in records)
    events = sum(len(r["events"]) for r in records)
    ttft = [r["events"][0] - r["sent"] for r in done]
    itl = [b - a for r in done for a, b in zip(r["events"], r["events"][1:], strict=False)]
    e2e = [r["events"][-1] - r["sent"] for r in done]
    wall = end - start
    return {
        "num_requests": len(records),
        "failed": sum(1 for r in records if r.get("error")),
        "output_tokens": tokens,
        "content_events": events,
        "wall_s": wall,
        "output_tok_s": tokens / wall if wall > 0 else float("nan"),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "itl_p50_s": percentile(itl, 50),
        "itl_p99_s": percentile(itl, 99),
        "itl_max_s": max(itl, default=float("nan")),
        "e2e_p50_s": percentile(e2e, 50),
        "events_per_token": events / tokens if tokens else float("nan"),
        "finish_reasons": sorted({str(r.get("finish_reason")) for r in records}),
    }


# ---- HTTP client ------------------------------------------------------------------------------------
async def _one_stream(client: Any, url: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    import msgspec

    body = {
        "model": "bench",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    record: dict[str, Any] = {"sent": time.monotonic(), "events": [], "tokens": 0, "finish_reason": None}
    decode = msgspec.json.decode
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                record["error"] = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return record
            buffer = b""
            async for chunk in response.aiter_raw():
                now = time.monotonic()
                buffer += chunk
                *events, buffer = buffer.split(b"\n\n")
                for event in events:
                    if not event.startswith(b"data: {"):
                        continue
                    payload = decode(event[6:])
                    if "error" in payload:
                        record["error"] = payload["error"].get("message")
                        continue
                    if payload.get("usage"):
                        record["tokens"] = payload["usage"]["completion_tokens"]
                    for choice in payload.get("choices") or ():
                        if choice.get("text"):
                            record["events"].append(now)
                        if choice.get("finish_reason"):
                            record["finish_reason"] = choice["finish_reason"]
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
    return record


async def _burst(base_url: str, reqs: list[tuple[list[int], int]], start_at: float) -> list[dict[str, Any]]:
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        url = base_url + "/v1/completions"
        return await asyncio.gather(*(_one_stream(client, url, p, n) for p, n in reqs))


def _burst_with(client: str, base_url: str, reqs: list[tuple[list[int], int]], start_at: float) -> Any:
    if client == "openai":  # the official openai client (benchmarks/openai_stream.py)
        from openai_stream import burst

        return burst(base_url, reqs, start_at)
    return _burst(base_url, reqs, start_at)


def _client_process(
    client: str, base_url: str, reqs: list[tuple[list[int], int]], start_at: float, conn: Any
) -> None:
    conn.send(asyncio.run(_burst_with(client, base_url, reqs, start_at)))
    conn.close()


def run_burst(
    base_url: str, reqs: list[tuple[list[int], int]], client_procs: int, client: str = "ours"
) -> dict[str, Any]:
    """All requests at one instant, from `client_procs` processes (1: this one)."""
    if client_procs <= 1:
        start = time.monotonic() + 0.2
        records = asyncio.run(_burst_with(client, base_url, reqs, start))
        return summarize(records, start)
    ctx = multiprocessing.get_context("spawn")
    start = time.monotonic() + 3.0  # time for the clients to start and connect their pools
    shares = [reqs[i::client_procs] for i in range(client_procs)]
    pipes, procs = [], []
    for share in shares:
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_client_process, args=(client, base_url, share, start, send))
        proc.start()
        pipes.append(recv)
        procs.append(proc)
    records = [r for recv in pipes for r in recv.recv()]
    for proc in procs:
        proc.join()
    return summarize(records, start)


# ---- the server -------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(runtime_args: list[str], log_path: Path, port: int) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "kvpilot.runtime",
        "--max-waiting-requests",
        "1000000",  # the whole burst is admitted (RUNTIME_ARGS may override it)
        *runtime_args,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        "bench",
    ]
    with log_path.open("wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def wait_healthy(proc: subprocess.Popen[bytes], base_url: str, log_path: Path, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            if httpx.get(base_url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the server was not healthy after {timeout:.0f}s:\n{log_path.read_text()[-4000:]}")


def warm_up(base_url: str, reqs: list[tuple[list[int], int]], vocab: int) -> None:
    """As bench.py warms the engine: a few short requests, then the burst's first prompt (its shapes)."""
    rng = random.Random(1)
    low = W1_VOCAB_LOW if vocab > 4 * W1_VOCAB_LOW else 4
    warm = [([rng.randrange(low, vocab - low) for _ in range(rng.randint(8, 32))], 8) for _ in range(4)]
    asyncio.run(_burst(base_url, warm, time.monotonic()))
    asyncio.run(_burst(base_url, [(reqs[0][0], 4)], time.monotonic()))


def http_mode(args: argparse.Namespace, reqs: list[tuple[list[int], int]], vocab: int) -> dict[str, Any]:
    port = args.port or free_port()
    base_url = f"http://127.0.0.1:{port}"
    log_path = Path(args.server_log or tempfile.mkstemp(prefix="kvpilot-burst-", suffix=".log")[1])
    proc = start_server(args.runtime_args, log_path, port)
    try:
        wait_healthy(proc, base_url, log_path, args.startup_timeout)
        warm_up(base_url, reqs, vocab)
        result = run_burst(base_url, reqs, args.client_procs, args.client)
        result["client"] = args.client
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    result["server_exit_code"] = code
    result["server_log"] = str(log_path)
    return result


# ---- engine level -----------------------------------------------------------------------------------
def engine_mode(args: argparse.Namespace, reqs: list[tuple[list[int], int]], vocab: int) -> dict[str, Any]:
    from kvpilot.runtime.engine.llm_engine import LLMEngine
    from kvpilot.runtime.sampling_params import SamplingParams
    from kvpilot.runtime.server import args as server_args

    parsed = server_args.parse_args(args.runtime_args)
    engine = LLMEngine.from_args(parsed.engine_args)

    def run(batch: list[tuple[list[int], int]], tag: str) -> list[dict[str, Any]]:
        records = {}
        for i, (prompt, out_len) in enumerate(batch):
            params = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True, detokenize=False)
            engine.add_request(f"{tag}-{i}", prompt, params)
            records[f"{tag}-{i}"] = {"sent": time.monotonic(), "events": [], "tokens": 0}
        while engine.has_unfinished_requests():
            outputs = engine.step()
            now = time.monotonic()
            for o in outputs:
                record = records[o.request_id]
                if o.new_token_ids:
                    record["events"].append(now)
                    record["tokens"] += len(o.new_token_ids)
                if o.finished:
                    record["finish_reason"] = o.finish_reason
                    record["error"] = getattr(o, "error", None)
        return list(records.values())

    rng = random.Random(1)
    low = W1_VOCAB_LOW if vocab > 4 * W1_VOCAB_LOW else 4
    run([([rng.randrange(low, vocab - low) for _ in range(rng.randint(8, 32))], 8) for _ in range(4)], "warm")
    run([(reqs[0][0], 4)], "warm-shape")
    start = time.monotonic()
    records = run(reqs, "burst")
    for record in records:
        record["sent"] = start
    return summarize(records, start)


def engine_mode_in_child(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "engine.json"
        cmd = [sys.executable, __file__, "--mode", "engine", "--out", str(out), *_request_flags(args)]
        subprocess.run([*cmd, "--", *args.runtime_args], check=True)
        return json.loads(out.read_text())["engine"]  # type: ignore[no-any-return]


def _request_flags(args: argparse.Namespace) -> list[str]:
    return [
        "--num-requests",
        str(args.num_requests),
        "--input-len",
        *map(str, args.input_len),
        "--output-len",
        *map(str, args.output_len),
        "--seed",
        str(args.seed),
    ]


# ---- a model directory of a real shape -------------------------------------------------------------
def write_model_dir(out: Path, shape: str, weights_from: Path | None = None) -> Path:
    """config.json of a real shape (kvpilot.runtime.bench's) for --load-format dummy, or config and weights
    copied from a checkpoint, and a word-level tokenizer with one word per id of the whole vocabulary, so
    that every generated token has text (random weights under a byte-level tokenizer produce runs of
    bytes that are no UTF-8, held back as no text; and most ids of a 151936-id model would decode to
    nothing with the 1024-id fixture tokenizer)."""
    from kvpilot.runtime.bench_workloads import qwen3_config
    from tokenizers import Tokenizer, models, pre_tokenizers

    out.mkdir(parents=True, exist_ok=True)
    if weights_from is not None:
        config = json.loads((weights_from / "config.json").read_text())
        for path in weights_from.glob("*.safetensors*"):
            (out / path.name).write_bytes(path.read_bytes())
    else:
        config = qwen3_config(shape)
    (out / "config.json").write_text(json.dumps(config))
    vocab = {f"w{i}": i for i in range(config["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(out / "tokenizer.json"))
    eos_id = config.get("eos_token_id")
    eos = f"w{eos_id[0] if isinstance(eos_id, list) else (eos_id or 0)}"
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos, "bos_token": None}))
    return out


# ---- report -----------------------------------------------------------------------------------------
ROWS = [
    ("output tok/s", "output_tok_s", 1, "{:,.0f}"),
    ("TTFT p50 (ms)", "ttft_p50_s", 1e3, "{:,.1f}"),
    ("TTFT p99 (ms)", "ttft_p99_s", 1e3, "{:,.1f}"),
    ("ITL p50 (ms)", "itl_p50_s", 1e3, "{:,.2f}"),
    ("ITL p99 (ms)", "itl_p99_s", 1e3, "{:,.2f}"),
    ("ITL max (ms)", "itl_max_s", 1e3, "{:,.1f}"),
    ("e2e p50 (s)", "e2e_p50_s", 1, "{:,.2f}"),
    ("events per token", "events_per_token", 1, "{:.3f}"),
    ("output tokens", "output_tokens", 1, "{:,}"),
    ("failed requests", "failed", 1, "{}"),
]


def table(results: dict[str, Any]) -> str:
    modes = [m for m in ("engine", "http") if m in results]
    lines = ["| measure | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for label, key, scale, fmt in ROWS:
        cells = [fmt.format(results[m][key] * scale if scale != 1 else results[m][key]) for m in modes]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if "ratio_http_to_engine" in results:
        lines.append(f"\nHTTP output tok/s = {results['ratio_http_to_engine']:.1%} of engine level")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    runtime_args: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, runtime_args = argv[:split], argv[split + 1 :]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("http", "engine", "both"), default="http")
    p.add_argument("-n", "--num-requests", type=int, default=256)
    p.add_argument("--input-len", type=int, nargs=2, default=(100, 1024), metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=(100, 1024), metavar=("MIN", "MAX"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--client-procs", type=int, default=1, help="client processes sharing the burst")
    p.add_argument(
        "--client",
        choices=("ours", "openai"),
        default="ours",
        help="the streaming client: ours (httpx + msgspec) or the official openai package",
    )
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--startup-timeout", type=float, default=STARTUP_TIMEOUT_S)
    p.add_argument("--server-log", default=None, help="the server's log file (default: a temp file)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument(
        "--write-model-dir",
        type=Path,
        default=None,
        help="only write a model directory of --shape (config + full-vocabulary tokenizer) here and exit",
    )
    p.add_argument("--shape", default="qwen3-0.6b", help="with --write-model-dir (see kvpilot.runtime.bench)")
    p.add_argument(
        "--weights-from",
        type=Path,
        default=None,
        help="with --write-model-dir: copy config and weights from here",
    )
    args = p.parse_args(argv)
    if args.write_model_dir is None and not _flag_value(runtime_args, "--model"):
        p.error("pass the server's flags after `--`, at least --model DIR")
    args.runtime_args = runtime_args
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.write_model_dir is not None:
        print(write_model_dir(args.write_model_dir, args.shape, args.weights_from))
        return 0
    vocab = vocab_size(args.runtime_args)
    reqs = make_requests(args.num_requests, tuple(args.input_len), tuple(args.output_len), vocab, args.seed)
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "commit": os.environ.get("KVPILOT_COMMIT", "unknown"),
        "runtime_args": args.runtime_args,
        "num_requests": args.num_requests,
        "input_len": list(args.input_len),
        "output_len": list(args.output_len),
        "seed": args.seed,
        "client_procs": args.client_procs,
    }
    if args.mode == "engine":
        results["engine"] = engine_mode(args, reqs, vocab)
    if args.mode == "both":
        results["engine"] = engine_mode_in_child(args)
    if args.mode in ("http", "both"):
        results["http"] = http_mode(args, reqs, vocab)
    if "engine" in results and "http" in results:
        results["ratio_http_to_engine"] = results["http"]["output_tok_s"] / results["engine"]["output_tok_s"]
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    print(table(results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
