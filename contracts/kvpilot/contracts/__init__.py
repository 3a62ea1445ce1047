"""What the operator, the gateway and the runtime must agree on, in one torch-free place.

The three programs share no process; they share these constants and pure functions instead, so a label,
a metric name, a runtime flag or the KV-cache arithmetic cannot drift between them.
"""
