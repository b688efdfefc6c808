import os

import pytest

# Kernels run in Triton's interpreter unless a GPU is present (CI has none).
os.environ.setdefault("TRITON_INTERPRET", "1")


def _has_gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _mtmc_home(tmp_path, monkeypatch):
    """Each test gets its own data directory (checkpoints, memory, artifacts)."""
    monkeypatch.setenv("MTMC_HOME", str(tmp_path / "mtmc-home"))


class ChatServer:
    """A local OpenAI-compatible endpoint (POST /v1/chat/completions, non-streaming) for the
    LLM tests: it records each request body and answers as `mode` says: "ok" (`reply`),
    "status" (HTTP `status` with an error body), "garbage" (200, not JSON), "empty" (empty
    content), "truncated" (`reply`, cut off at the token limit) or "sleep" (`sleep_s`, then
    `reply`).  `script`, a list of (mode, reply) pairs, answers the next requests first, in order."""

    def __init__(self):
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.mode, self.reply, self.status, self.sleep_s, self.requests = "ok", "", 500, 3.0, []
        self.script: list[tuple[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.rstrip("/") != "/v1/chat/completions":
                    return self._send(404, b'{"error": {"message": "no such route"}}')
                server.requests.append(json.loads(body))
                mode, reply = server.script.pop(0) if server.script else (server.mode, server.reply)
                if mode == "status":
                    return self._send(server.status, b'{"error": {"message": "the model is overloaded"}}')
                if mode == "garbage":
                    return self._send(200, b"<html>gateway says hello</html>")
                if mode == "sleep":
                    import time
                    time.sleep(server.sleep_s)
                content = "" if mode == "empty" else reply
                self._send(200, json.dumps({
                    "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": "stub",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                 "finish_reason": "length" if mode == "truncated" else "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode())

            def _send(self, code, data):
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):   # the client gave up (timeout tests)
                    pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads, self._httpd.block_on_close = True, False
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def close(self):
        self._httpd.shutdown()
        self._httpd.server_close()

    def prompt(self, i: int = -1) -> str:
        """The messages of request `i`, joined: what the model was given."""
        return "\n".join(m["content"] for m in self.requests[i]["messages"])


@pytest.fixture
def chat_server():
    server = ChatServer()
    yield server
    server.close()
