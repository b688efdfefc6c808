"""Inputs refused before anything runs, with the reason in words: a shape whose tensors cannot
fit the target GPU's memory (the chat and `mtmc generate`), and files that are not Python modules
or exceed the upload limit (the chat and the command line apply the same rules)."""
import subprocess
import sys

import pytest

from mtmc.agents.context import Context
from mtmc.agents.runner import run_request
from mtmc.module import module_file
from mtmc.tools.hardware import PROFILES

HUGE = "relu on a 1000000x1000000 fp32 tensor"          # 4 TB in, 4 TB out


def _mtmc(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtmc.commands.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_profiles_know_their_memory():
    gib = {k: p.memory_bytes / 2**30 for k, p in PROFILES.items()}
    assert 138 <= gib["h200"] <= 141 and 74 <= gib["h100"] <= 80 and 74 <= gib["a100"] <= 80 and 29 <= gib["v100"] <= 32


def test_a_shape_that_cannot_fit_the_gpu_is_refused_with_the_numbers():
    events = []
    state = run_request(HUGE, Context(target="h200"), on_event=events.append)
    assert state["status"] == "unsupported" and not state.get("steps")
    msg = state["message"]
    assert "8,000,000,000,000 bytes" in msg and "NVIDIA H200" in msg and f"{PROFILES['h200'].memory_bytes:,} bytes" in msg
    assert [e["event"] for e in events] == ["unsupported"]
    # the limit is the target's: 100000x100000 fp32 (80 GB) fits an H200, not a V100
    assert "does not fit" in run_request("relu on a 100000x100000 fp32 tensor", Context(target="v100"))["message"]
    # a follow-up that makes it too big (a spec handed over, as the chat does) is refused the same way
    small = run_request("relu on a 1000x1000 fp32 tensor", Context(target="h200", max_steps=0))
    big = {**small["spec"], "dims": {"M": 1000000, "N": 1000000}}
    assert run_request("make it 1000000x1000000", Context(target="h200"), spec=big)["status"] == "unsupported"


def test_generate_refuses_it_too_and_exits_2(tmp_path):
    proc = _mtmc("generate", HUGE, "--out", str(tmp_path / "k.py"))
    assert proc.returncode == 2 and not (tmp_path / "k.py").exists()
    assert "8,000,000,000,000 bytes" in proc.stdout and "of the roof" not in proc.stdout


def test_the_chat_refuses_it_with_the_numbers():
    from mtmc.ui.chat import Chat
    updates = list(Chat().respond({"text": HUGE, "files": []}, [], None, {"target": "h200", "max_steps": 1}))
    text = "\n".join(m["content"] for m in updates[-1]["chat"] if isinstance(m.get("content"), str))
    assert "8,000,000,000,000 bytes" in text and "NVIDIA H200" in text
    assert "roofline" not in updates[-1] and "code" not in updates[-1]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "not_python.txt").write_text("class Model: pass\n")
    (tmp_path / "big.py").write_text("#" * (module_file.MAX_UPLOAD_BYTES + 1) + "\n")
    return tmp_path


@pytest.mark.parametrize("args", [("optimize", "{d}/not_python.txt", "--out", "{d}/new.py"),
                                  ("optimize", "{d}/not_python.txt", "--plan-only"),
                                  ("verify", "{d}/not_python.txt", "{d}/not_python.txt")])
def test_the_command_line_takes_python_files_only(files, args):
    proc = _mtmc(*(a.format(d=files) for a in args))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "only Python modules (.py)" in out, out
    assert "AttributeError" not in out and "Traceback" not in out


@pytest.mark.parametrize("command", ["optimize", "verify"])
def test_the_command_line_applies_the_chats_upload_limit(files, command):
    args = ["{d}/big.py", "--out", "{d}/new.py"] if command == "optimize" else ["{d}/big.py", "{d}/big.py"]
    proc = _mtmc(command, *(a.format(d=files) for a in args))
    assert proc.returncode == 2 and f"the limit is {module_file.MAX_UPLOAD_BYTES // 1024} KB" in proc.stdout + proc.stderr


def test_one_limit_for_the_chat_and_the_command_line():
    from mtmc.ui import upload
    from mtmc.ui.layout import launch_options
    assert upload.MAX_UPLOAD_BYTES is module_file.MAX_UPLOAD_BYTES
    assert launch_options(None)["max_file_size"] == module_file.MAX_UPLOAD_BYTES
