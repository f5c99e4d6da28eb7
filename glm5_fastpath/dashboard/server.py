"""The dashboard HTTP server: GET / (the page), GET /api/metrics (scrape + aggregate), GET /healthz."""
from __future__ import annotations

import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from .aggregate import parse, summarize

PAGE = Path(__file__).resolve().parent / "page.html"


class Scraper:
    """Fetches the Prometheus text from `url` and keeps the previous snapshot for windowed numbers."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url, self.timeout = url, timeout
        self._prev = None
        self._lock = threading.Lock()

    def fetch(self) -> str:
        with urllib.request.urlopen(self.url, timeout=self.timeout) as r:  # noqa: S310 - user-given URL
            return r.read().decode("utf-8", "replace")

    def poll(self) -> dict:
        try:
            text = self.fetch()
        except Exception as e:  # noqa: BLE001 - report to the page, keep serving
            return {"ok": False, "error": f"cannot scrape {self.url}: {e}", "ts": time.time()}
        try:
            with self._lock:
                cur = parse(text, time.time())
                out = summarize(cur, self._prev)
                self._prev = cur
        except Exception as e:  # noqa: BLE001
            return {"ok": False, "error": f"cannot parse metrics from {self.url}: {e}", "ts": time.time()}
        out.update(ok=True, source=self.url)
        return out


def make_server(metrics_url: str, host: str = "127.0.0.1", port: int = 8088) -> ThreadingHTTPServer:
    scraper = Scraper(metrics_url)
    page = PAGE.read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802 - http.server naming
            path = self.path.split("?", 1)[0]
            if path in ("/", "/index.html"):
                self._send(200, page, "text/html; charset=utf-8")
            elif path == "/api/metrics":
                self._send(200, json.dumps(scraper.poll()).encode(), "application/json")
            elif path == "/healthz":
                self._send(200, b"ok\n", "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

        def log_message(self, fmt, *args):  # quiet: one line per request is noise for a poller
            pass

    srv = ThreadingHTTPServer((host, port), Handler)
    srv.daemon_threads = True
    srv.scraper = scraper
    return srv


def serve(metrics_url: str, host: str = "127.0.0.1", port: int = 8088) -> None:
    srv = make_server(metrics_url, host, port)
    print(f"glm5-fastpath dashboard: http://{host}:{srv.server_address[1]}/  (reading {metrics_url}; Ctrl-C stops)",
          flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
