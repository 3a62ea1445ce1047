"""The model runner: the only part of the engine that touches the device.

execute(StepBatch) flattens the step's prefill chunks and decodes into one varlen batch, writes their K/V
into the paged cache, attends over it and returns the logits of the rows that will be sampled.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext

import torch
from kvpilot.contracts.kv_cache import kv_heads_per_rank
from kvpilot.runtime.config import ModelConfig
from kvpilot.runtime.distributed.comm import Comm
from kvpilot.runtime.distributed.micro_batch import RIDGE_TOKENS_CPU, RIDGE_TOKENS_GPU
from kvpilot.runtime.distributed.pipeline import PipelineStage
from kvpilot.runtime.distributed.topology import stage_layers
from kvpilot.runtime.engine.batch import SeqChunk, StepBatch
from kvpilot.runtime.engine.cuda_graphs import StepGraphs, fits_verify_graph
from kvpilot.runtime.engine.engine_args import EngineArgs
from kvpilot.runtime.engine.memory import kv_cache_blocks, profile_peak
from kvpilot.runtime.engine.model_inputs import (
    ModelInputs,
    prepare_inputs,
    prepare_padded_inputs,
    prepare_prefill_graph_inputs,
    prompt_row_indices,
)
from kvpilot.runtime.engine.prefill_graphs import PREFILL_GRAPH_STEP, PrefillGraphs
from kvpilot.runtime.engine.runner_setup import (
    CPU_KV_CACHE_BYTES,
    CPU_KV_CACHE_SEQS,
    cpu_num_kv_blocks,
    kv_block_bytes,
    kv_dtype_name,
    resolve_device,
    resolve_dtype,
    resolve_kv_cache_dtype,
)
from kvpilot.runtime.engine.sampler import SampledIds
from kvpilot.runtime.errors import ModelLoadError
from kvpilot.runtime.kernels.kv_cache import KVCache, is_scaled
from kvpilot.runtime.layers.attention import AttentionMetadata
from kvpilot.runtime.layers.kernel_ops import kernel_ops
from kvpilot.runtime.loader import load_model

# re-exported: callers import these from here
__all__ = [
    "CPU_KV_CACHE_BYTES",
    "CPU_KV_CACHE_SEQS",
    "ModelRunner",
    "cpu_num_kv_blocks",
    "fill_placeholders",
    "kv_block_bytes",
    "kv_dtype_name",
    "resolve_device",
    "resolve_dtype",
    "resolve_kv_cache_dtype",
]

log = logging.getLogger(__name__)
# Decode graphs fix the block-table width, and the split-KV decode plan is sized for that width: with a
# 32k-40k max_model_len every short sequence would get a few long partitions (too few programs at small
# batch). Graphs cover contexts up to this; longer decodes run eagerly with a plan sized to the batch.
# (16k, not 8k: W2L's 8k prompts + 256 tokens decoded eagerly were host-bound with an 8-bit cache, 25.2 ms
# per step against 20.1 ms of kernels; BENCHMARKS.md, fourth session. The kernels size each sequence's
# partitions from its own context, so a wider table costs short sequences little.)
GRAPH_MAX_CONTEXT = 16384


def fill_placeholders(input_ids: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
    """Input ids with each placeholder -1 - r replaced by sampled[r] (device ops only, no sync)."""
    rows = (-1 - input_ids).clamp_(min=0)
    return torch.where(input_ids < 0, sampled.to(input_ids.dtype)[rows], input_ids)


class ModelRunner:
    def __init__(self, args: EngineArgs, comm: Comm | None = None) -> None:
        """Loads args.model on its device. load_format "auto" reads the safetensors, "dummy" makes seeded
        random weights (benchmarks). On CUDA the KV cache is sized by profiling a step of
        max_num_batched_tokens tokens, and decode steps of up to max_num_seqs sequences replay CUDA graphs
        unless enforce_eager. The kernels are chosen once here: triton on CUDA, the torch references
        elsewhere (or args.kernel_backend).

        With `comm` (tensor / pipeline parallel; see kvpilot.runtime.distributed) this runner is one rank's:
        its part of the model on comm.device, its KV heads and layers; every rank allocates the same number
        of KV blocks (the fewest any rank can hold)."""
        args.validate()
        self.model_config = ModelConfig.from_dir(args.model)
        self.device = resolve_device(args.device) if comm is None else comm.device
        self.comm = comm or Comm.single(self.device)
        self.block_size, self.seed = args.block_size, args.seed
        backend = args.kernel_backend
        self.ops = kernel_ops(
            backend if backend != "auto" else ("triton" if self.device.type == "cuda" else "cpu")
        )
        self.dtype = resolve_dtype(args.dtype, self.model_config, self.device)
        limit = self.model_config.max_position_embeddings
        if args.max_model_len is not None and args.max_model_len > limit:
            raise ModelLoadError(
                f"max_model_len {args.max_model_len} exceeds the model's max_position_embeddings {limit}"
            )
        self.max_model_len = args.max_model_len or limit
        self.model = load_model(
            args.model,
            self.model_config,
            device=self.device,
            dtype=self.dtype,
            ops=self.ops,
            max_positions=limit,
            load_format=args.load_format,
            seed=args.seed,
            comm=self.comm,
            quantization=args.quantization,
        )
        self.kv_cache_dtype = resolve_kv_cache_dtype(args.kv_cache_dtype, self.dtype)
        self.graphs: StepGraphs | None = None  # decode steps (one query token per sequence)
        self.verify_graphs: StepGraphs | None = None  # speculative verification (capture_verify_graphs)
        self.prefill_graphs: PrefillGraphs | None = None  # a lone prompt's prefill (prefill_graphs.py)
        self.graph_blocks = -(-min(self.max_model_len, GRAPH_MAX_CONTEXT) // self.block_size)
        self.pipeline: PipelineStage | None = None
        if self.comm.rank.pp > 1:
            default_ridge = RIDGE_TOKENS_GPU if self.device.type == "cuda" else RIDGE_TOKENS_CPU
            self.pipeline = PipelineStage(
                self.model,
                self.comm,
                hidden_size=self.model_config.hidden_size,
                vocab_size=self.model_config.vocab_size,
                dtype=self.dtype,
                ridge_tokens=args.pipeline_ridge_tokens or default_ridge,
            )
        self.num_kv_blocks = args.num_kv_blocks or self.comm.min_over_ranks(
            self._size_kv_cache(args.gpu_memory_utilization, args.max_num_seqs, args.max_num_batched_tokens)
        )
        self.kv_caches = self._allocate_kv_cache()
        log.info(
            "KV cache: %d blocks of %d tokens = %d tokens (%.2f GiB, %s)",
            self.num_kv_blocks,
            self.block_size,
            self.num_kv_blocks * self.block_size,
            self.num_kv_blocks * self._block_bytes() / 2**30,
            self.kv_cache_dtype,
        )
        eager_pipeline = self.comm.rank.pp > 1  # pipeline stages send and receive eagerly
        if (
            self.device.type == "cuda"
            and self.ops.name == "triton"
            and not args.enforce_eager
            and not eager_pipeline
        ):
            self.graphs = self._step_graphs(args.max_num_seqs, 1)
            self.graphs.capture()
            self._capture_prefill_graphs(args)

    def _capture_prefill_graphs(self, args: EngineArgs, *, eager: bool = False) -> None:
        """Graphs for lone prompts up to prefill_graph_max_tokens (within the step budget and the model
        length), in the decode graphs' memory pool; one rank only (tensor parallel ranks stay eager)."""
        limit = min(args.prefill_graph_max_tokens, args.max_num_batched_tokens, self.max_model_len)
        if limit < PREFILL_GRAPH_STEP or self.comm.rank.tp > 1:
            return
        self.prefill_graphs = PrefillGraphs(
            self._prefill_logits, max_tokens=limit, block_size=self.block_size, device=self.device
        )
        self.prefill_graphs.capture(eager=eager, pool=None if self.graphs is None else self.graphs.pool)

    def _prefill_logits(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, rows: torch.Tensor
    ) -> torch.Tensor:
        """The model on every row, the LM head on `rows` (what the prefill graphs capture)."""
        return self.model.compute_logits(self.model(input_ids, positions, self.kv_caches, meta)[rows])

    def _step_graphs(self, max_num_seqs: int, query_len: int) -> StepGraphs:
        return StepGraphs(
            self._forward_logits,
            max_num_seqs=max_num_seqs,
            max_blocks_per_seq=self.graph_blocks,
            block_size=self.block_size,
            device=self.device,
            query_len=query_len,
        )

    def capture_verify_graphs(
        self, num_speculative_tokens: int, max_num_seqs: int, *, eager: bool = False
    ) -> None:
        """Graphs for verification steps of up to max_num_seqs sequences with k + 1 query tokens each
        (fewer drafts are front-padded), sharing the decode graphs' memory pool. Only where decode steps
        replay graphs; eager=True builds replay-eagerly stand-ins on any device (tests)."""
        if self.graphs is None and not eager:
            return
        self.verify_graphs = self._step_graphs(max_num_seqs, num_speculative_tokens + 1)
        self.verify_graphs.capture(eager=eager, pool=None if self.graphs is None else self.graphs.pool)

    def _block_bytes(self) -> int:
        return kv_block_bytes(self.model_config, self.block_size, self.kv_cache_dtype, self.comm.rank)

    def _size_kv_cache(self, utilization: float, max_num_seqs: int, max_num_batched_tokens: int) -> int:
        blocks_per_seq = -(-self.max_model_len // self.block_size)
        if self.device.type != "cuda":
            return cpu_num_kv_blocks(
                block_bytes=self._block_bytes(), block_size=self.block_size, max_model_len=self.max_model_len
            )
        with self.pipeline.whole_steps() if self.pipeline is not None else nullcontext():
            # a pipeline stage profiles the step whole: a step that is not split (prompt logprobs) is larger
            profile = profile_peak(
                self.device, lambda: self._worst_step(max_num_seqs, max_num_batched_tokens)
            )
        return kv_cache_blocks(
            profile,
            gpu_memory_utilization=utilization,
            block_bytes=self._block_bytes(),
            blocks_per_seq=blocks_per_seq,
            max_model_len=self.max_model_len,
        )

    def _worst_step(self, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        """A prefill of max_num_batched_tokens tokens over max_num_seqs sequences, every one sampled,
        against a scratch cache just big enough; everything it allocates is freed on return."""
        seqs = max(1, min(max_num_seqs, max_num_batched_tokens))
        per_seq = max(1, max_num_batched_tokens // seqs)
        blocks_per_seq = -(-per_seq // self.block_size)
        chunks, next_block = [], 0
        for i in range(seqs):
            table = list(range(next_block, next_block + blocks_per_seq))
            next_block += blocks_per_seq
            chunks.append(SeqChunk(i, [1] * per_seq, 0, table, True))
        self.num_kv_blocks = next_block
        self.kv_caches = self._allocate_kv_cache()
        logits = self.execute(StepBatch(chunks))
        torch.softmax(logits, dim=-1)  # the sampler's largest temporary is of this size
        del logits
        # That step is prefix-free (its attention reads the step's K/V rows: PagedAttention.uses_step_kv);
        # a chunk after cached tokens beside a prompt runs the paged prefill variants, so they compile
        # here rather than on the first chunked or prefix-cached step while serving.
        blocks = -(-5 // self.block_size)
        if next_block >= 2 * blocks:
            tables = [list(range(blocks)), list(range(blocks, 2 * blocks))]
            self.execute(
                StepBatch(
                    [SeqChunk(0, [1] * 3, 2, tables[0], True), SeqChunk(1, [1] * 2, 0, tables[1], True)]
                )
            )
        del self.kv_caches

    def _allocate_kv_cache(self) -> list[KVCache]:
        """One tensor [layers, 2, num_blocks, block_size, kv_heads, head_dim] and, for 8-bit caches, one
        float32 [layers, 2, num_blocks, block_size, kv_heads] of per-token-head scales; per-layer views.
        layers and kv_heads are this rank's: its pipeline stage's layers, its tensor-parallel KV heads."""
        cfg, rank = self.model_config, self.comm.rank
        layers = len(stage_layers(cfg.num_hidden_layers, rank.pp, rank.pp_rank))
        kv_heads = kv_heads_per_rank(cfg.num_key_value_heads, rank.tp)
        shape = (layers, 2, self.num_kv_blocks, self.block_size, kv_heads)
        cache = torch.zeros(*shape, cfg.head_dim, dtype=self.kv_cache_dtype, device=self.device)
        if not is_scaled(self.kv_cache_dtype):
            return [KVCache(cache[layer, 0], cache[layer, 1]) for layer in range(layers)]
        scales = torch.zeros(*shape, dtype=torch.float32, device=self.device)
        return [
            KVCache(cache[layer, 0], cache[layer, 1], scales[layer, 0], scales[layer, 1])
            for layer in range(layers)
        ]

    def _forward_logits(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Every row's logits (decode: every row is sampled); what the CUDA graphs capture."""
        return self.model.compute_logits(self.model(input_ids, positions, self.kv_caches, meta))

    @torch.inference_mode()
    def execute(self, batch: StepBatch, prev_sampled: SampledIds | None = None) -> torch.Tensor:
        """Run one step; returns logits [batch.num_sampled, vocab_size] in chunk order, then one row per
        token of batch.prompt_logprob_rows, in the LM head GEMM's dtype (float32 on a CPU, bf16 on a GPU).

        A negative input token id -1 - r is a placeholder for row r of `prev_sampled`, the previous
        step's sampled ids: it is filled on the device, without waiting for that step to end."""
        if not batch.chunks:
            return torch.empty(0, self.model_config.vocab_size, device=self.device)
        if prev_sampled is None and self.prefill_graphs is not None:
            bucket = self.prefill_graphs.bucket(batch)
            if bucket is not None:  # a lone prompt: one replay instead of ~10 launches per layer
                inputs = prepare_prefill_graph_inputs(batch.chunks[0], bucket, self.block_size, self.device)
                return self.prefill_graphs.run(inputs, bucket)
        graphs, size = self._graphs_for(batch)
        if graphs is not None and graphs.query_len > 1:
            inputs = prepare_padded_inputs(batch, self.block_size, self.device, graphs.query_len)
        else:
            inputs = prepare_inputs(batch, self.block_size, self.device)
        if prev_sampled is not None:
            inputs.input_ids = fill_placeholders(inputs.input_ids, prev_sampled.ids)
        if batch.prompt_logprob_rows:  # prompt logprobs too: run eagerly
            rows = torch.cat([inputs.sample_indices, prompt_row_indices(batch, self.device)])
            return self._eager_logits(batch, inputs, rows)
        if graphs is not None and size is not None:
            logits = graphs.run(inputs, size)
            every_row = inputs.sample_indices.shape[0] == logits.shape[0]
            return logits if every_row else logits[inputs.sample_indices]
        return self._eager_logits(batch, inputs, inputs.sample_indices)

    def _eager_logits(self, batch: StepBatch, inputs: ModelInputs, rows: torch.Tensor) -> torch.Tensor:
        """The logits of `rows`; a pipeline stage runs its part in micro-batches and passes the rest on
        (distributed/pipeline.py)."""
        if self.pipeline is not None:
            return self.pipeline.logits(batch, inputs, self.kv_caches, rows)
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
        return self.model.compute_logits(hidden[rows])

    def _graphs_for(self, batch: StepBatch) -> tuple[StepGraphs | None, int | None]:
        """The graph set and bucket that can run this batch, or (None, None): run it eagerly."""
        if batch.prompt_logprob_rows:
            return None, None
        graphs = self.graphs if batch.is_decode_only else self.verify_graphs
        if graphs is None or (
            graphs is self.verify_graphs and not fits_verify_graph(batch, graphs.query_len)
        ):
            return None, None
        size = graphs.bucket(len(batch.chunks), max(len(c.block_table) for c in batch.chunks))
        return (graphs, size) if size is not None else (None, None)
