"""kvpilot gateway: OpenAI-compatible front door with prefix-aware routing and queue-depth autoscaling.

Public entry points (reused by the local stack, `kvpilot up`):

- :class:`kvpilot.gateway.config.GatewayConfig` — the documented configuration model.
- :func:`kvpilot.gateway.app.create_app` — the FastAPI app factory.
- :class:`kvpilot.gateway.autoscale.local.LocalDriver` — starts/stops runtime processes on this machine.
"""
