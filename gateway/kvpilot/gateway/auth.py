"""Optional API keys (off unless a key file is configured): `Authorization: Bearer <key>`."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from pathlib import Path

from kvpilot.gateway.openai_errors import Unauthorized


def load_keys(path: Path) -> frozenset[str]:
    """One key per line; blank lines and `#` comments are ignored. A mounted Secret works the same way."""
    keys = {line.strip() for line in path.read_text().splitlines()}
    keys = {k for k in keys if k and not k.startswith("#")}
    if not keys:
        raise ValueError(f"API key file {path} holds no keys")
    return frozenset(keys)


class ApiKeys:
    def __init__(self, keys: frozenset[str] | None) -> None:
        self.keys = keys

    @property
    def enabled(self) -> bool:
        return self.keys is not None

    def check(self, headers: Mapping[str, str]) -> None:
        if self.keys is None:
            return
        scheme, _, token = headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        if not any(hmac.compare_digest(token, key) for key in self.keys):
            raise Unauthorized("incorrect API key provided")
