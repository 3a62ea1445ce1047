"""OpenAI-compatible HTTP server for the runtime engine (FastAPI + one engine-loop thread).

Entry point: `kvpilot-runtime` (kvpilot.runtime.__main__). `build_app` takes an EngineClient, so any
object with the LLMEngine interface can be served (tests use a small fake).
"""
