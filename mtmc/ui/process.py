"""Start `python app.py` in a child process and wait until it answers: how the tests (and the
README screenshot) drive the real app, launched the way a user launches it."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_app(env: dict[str, str], args: list[str] = (), startup_s: float = 120.0, log: Path | None = None,
                flags: bool = True):
    """Yields the app's URL; the app gets os.environ updated with `env`; stopped on exit.  The
    address goes in as --host / --port, or with flags=False as Gradio's GRADIO_SERVER_* variables."""
    port = free_port()
    out = open(log, "w") if log else subprocess.DEVNULL
    if flags:
        args = ["--host", "127.0.0.1", "--port", str(port), *args]
    else:
        env = {**env, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port)}
    proc = subprocess.Popen([sys.executable, str(APP), *args], env={**os.environ, **env},
                            stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"app.py exited with {proc.returncode}" + (f"; see {log}" if log else ""))
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError as exc:
                if getattr(exc, "code", None) in (401, 403):   # a login page answers too
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"app.py did not answer on {url} within {startup_s:.0f} s") from exc
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        if log:
            out.close()
