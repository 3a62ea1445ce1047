"""A stand-in for a `kvpilot-runtime` process (LocalDriver supervision tests): answers /health on --port."""

from __future__ import annotations

import argparse
import http.server


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args, _ = parser.parse_known_args()
    http.server.HTTPServer(("127.0.0.1", args.port), Health).serve_forever()
