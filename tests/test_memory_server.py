"""The memory against a real Chroma server (`chroma run` on loopback), as used when
MTMC_CHROMA_HOST is set: writes, nearest-spec retrieval, another process (the CLI) reading
through the server, and rebuilding the server's collection from the local log."""
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from mtmc.memory import Store
from mtmc.tools.hardware import PROFILES
from test_memory import H200, synthetic_record

CHROMA = shutil.which("chroma")
pytestmark = pytest.mark.skipif(CHROMA is None, reason="the `chroma` server executable (from chromadb) is not on PATH")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def chroma_server(tmp_path):
    port, data = _free_port(), tmp_path / "server-data"
    log = open(tmp_path / "chroma.log", "wb")
    proc = subprocess.Popen([CHROMA, "run", "--path", str(data), "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/heartbeat", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("chroma run did not come up: "
                                       + (tmp_path / "chroma.log").read_text(errors="replace")[-2000:])
                time.sleep(0.3)
        yield port, data
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _cli_search(*args) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "mtmc.commands.cli", "memory", "search", *args, "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [h["id"] for h in json.loads(proc.stdout)]


def test_memory_on_a_real_chroma_server(chroma_server, monkeypatch):
    port, data = chroma_server
    monkeypatch.setenv("MTMC_CHROMA_HOST", f"127.0.0.1:{port}")
    store = Store()
    softmax = synthetic_record("softmax", "softmax", {"M": 4096, "N": 8192})
    rms = synthetic_record("norm", "rmsnorm", {"M": 8192, "N": 4096}, "float32")
    mm = synthetic_record("matmul", "matmul", {"M": 512, "N": 512, "K": 512}, "float32", gpu="a100")
    for rec in (softmax, rms, mm):
        store.add(rec)
        assert store.index_note is None
    assert not (store.root / "chroma").exists()  # the index is the server's, not a local directory
    assert data.exists()

    near = {**softmax.spec, "dims": {"M": 4000, "N": 8192}}
    assert store.similar(near, H200)[0]["id"] == softmax.id
    assert [h["id"] for h in store.search("matrix multiply", op="matmul", gpu=PROFILES["a100"].name)] == [mm.id]
    # Another process (the CLI) reads the same histories through the server.
    assert _cli_search("root mean square normalization", "--gpu", "h200") == [rms.id, softmax.id]

    # Rebuild drops the server's collection and restores it from the local log.
    before = [h["id"] for h in store.search("softmax over rows of a half tensor", k=3)]
    assert store.rebuild() == 3
    assert [h["id"] for h in store.search("softmax over rows of a half tensor", k=3)] == before
    assert store.similar(near, H200)[0]["id"] == softmax.id
