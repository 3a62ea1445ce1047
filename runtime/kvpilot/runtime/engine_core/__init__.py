"""The engine-core process and how the HTTP process talks to it (vLLM V1's split).

`kvpilot-runtime` runs two processes, so that neither waits on the other's GIL:

  HTTP process (kvpilot.runtime.server; no torch)        engine-core process (this package)
    FastAPI/uvicorn, validation, admission (503s)          scheduler, block manager, model runner
    tokenization (prompts, chat templates)   --AddGroup/Abort/Shutdown-->   engine.add_request / abort
    detokenization, stop strings, SSE, metrics  <--Ready | LoadFailed, then one StepOutputs per step--

Transport: ZeroMQ PUSH/PULL over ipc:// sockets in a private temp dir; payloads are msgspec structs as
MessagePack (messages.py). The HTTP process starts the core with `python -m kvpilot.runtime.engine_core`
(client.py), hands it its config on stdin and keeps that pipe open: the core exits when the HTTP
process is gone, and the HTTP process sees the core's exit at once (a thread waits on it).

Text lives in the HTTP process (server/output_processor.py says why and what that costs); the core
handles the token-level stops. With tensor/pipeline parallelism the core is rank 0: it starts one worker
process per further GPU (kvpilot.runtime.distributed) and broadcasts its step inputs to them; the HTTP side
does not change.
"""
