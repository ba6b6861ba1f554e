"""STAND-IN kubelet health endpoint for lab hosts (tests only; the lab has no Kubernetes).

Started by the systemctl stand-in as the "kubelet daemon": answers GET /healthz with "ok" on
127.0.0.1:10248, the kubelet's real healthz address. Retries the bind for a few seconds because the
server it replaces may still hold the port for a moment after being killed.
"""

import http.server
import sys
import time


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.path == "/healthz"
        body = b"ok" if ok else b"not found"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Standin-Version", sys.argv[1] if len(sys.argv) > 1 else "")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


deadline = time.monotonic() + 10
while True:
    try:
        server = http.server.HTTPServer(("127.0.0.1", 10248), Health)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
server.serve_forever()
