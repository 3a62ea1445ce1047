"""Tensor and pipeline parallelism: one process per device, torch.distributed between them.

  topology.py  who is who: ranks, tensor/pipeline coordinates, each stage's layers, LWS multi-node env
  sharding.py  which slice of a checkpoint tensor a rank holds (pure arithmetic)
  quant_sharding.py  which slice of a quantized (AWQ/GPTQ/fp8/at-load) tensor a rank holds
  comm.py      the collectives the layers and the pipeline use (NCCL on GPU, gloo on CPU)
  micro_batch.py  splitting a pipeline step into micro-batches and the wavefront order (pure)
  pipeline.py  one pipeline stage's part of a step: micro-batches through isend/irecv
  executor.py  rank 0 broadcasts each step's inputs; the other ranks follow them
  launch.py    spawning and supervising the worker processes (a dead worker ends the server)
  worker.py    the worker process's entry point (`python -m kvpilot.runtime.distributed.worker`)

Rank r of tp x pp: tensor-parallel rank r % tp within pipeline stage r // tp. Scheduling and sampling
run on rank 0 (stage 0's first rank); the last stage hands rank 0 the logits.
"""
