"""Fixtures shared by the transformers-integration tests."""

import io
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image


@pytest.fixture()
def http_server():
    """A loopback server that counts requests and serves a real PNG: a fetch would succeed and be seen.
    Yields (url, hits)."""
    hits = []
    buf = io.BytesIO()
    Image.new("RGB", (150, 90), "blue").save(buf, "PNG")
    png = buf.getvalue()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(png)))
            self.end_headers()
            self.wfile.write(png)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/doc.png", hits
    server.shutdown()
    server.server_close()
