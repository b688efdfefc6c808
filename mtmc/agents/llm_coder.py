"""The coder role with a model, for an op outside the catalog (issue 18): the parser role gave a
PyTorch reference and its inputs (request.llm_parse.CustomOp); the model writes a Triton kernel
file for it (prompts/coder.md), then applies one macro instruction per step.  Every draft goes
through the guard (tools.guard: a sandboxed child on fresh inputs, poisoned outputs, own kernels,
tolerance, no result caching) against the reference as `Model`, exactly as template drafts and
uploads do; a rejected draft is shown its verdict and written again (bounded), and a step that
stays rejected rolls back to the last accepted draft.  Nothing the model writes runs here."""
from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mtmc.request.llm_parse import CustomOp
from mtmc.tools.guard.report import format_verdict
from mtmc.tools.guard.verifier import DEFAULT_TIMEOUT_S, ReferenceFailed, check_candidate, run_reference
from mtmc.tools.hardware import resolve
from mtmc.tools.llm import LLMFailure, ask, prompt

ROLE = "coder"
FIX_ATTEMPTS = 2     # drafts per instruction (the first and one fix after a rejection)
# The macro moves the coder is given one at a time (a custom op has no template knobs to turn).
MACRO_STEPS = ("Double the elements each program handles (its BLOCK size) so fewer, fuller programs cover the "
               "input; keep loads coalesced and masked.",
               "Launch with num_warps=8 and make the block size a multiple of 8 * 32 * 4 elements so every "
               "thread issues 128-bit loads.")

_DTYPE = {"float32": "torch.float32", "float16": "torch.float16", "bfloat16": "torch.bfloat16"}
_CODE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)


@dataclass
class CoderResult:
    source: str | None                  # the last accepted draft (None: none was accepted)
    steps: list[dict] = field(default_factory=list)   # instruction, outcome, verdict line per draft
    message: str = ""


def reference_module(op: CustomOp) -> str:
    """The reference as a module file the guard takes as `Model`."""
    shapes = ", ".join(f"torch.randn({i['shape']}, dtype={_DTYPE[i['dtype']]})" for i in op.inputs)
    return (f"import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n{op.reference.strip()}\n\n\n"
            "class Model(nn.Module):\n    def forward(self, *inputs):\n        return reference(*inputs)\n\n\n"
            f"def get_inputs():\n    return [{shapes}]\n\n\ndef get_init_inputs():\n    return []\n")


def write_kernel(op: CustomOp, llm, calls: list | None = None, steps: int = len(MACRO_STEPS), target: str = "h200",
                 device: str | None = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S, on_step=None) -> CoderResult:
    """The model's kernel for `op`, every draft verified by the guard; never raises."""
    work = Path(tempfile.mkdtemp(prefix="llm-coder-"))
    ref_path = work / "reference.py"
    ref_path.write_text(reference_module(op))
    result = CoderResult(None)
    try:
        with run_reference(ref_path, device, timeout_s) as ref:
            coder = _Coder(op, llm, calls, ref, work, target, timeout_s, result, on_step)
            coder.step("Write the first draft.")
            if result.source is None:
                result.message = f"no draft of {op.name} passed the guard; it stays unserved"
                return result
            for instruction in MACRO_STEPS[:steps]:
                coder.step(instruction)
            result.message = f"{op.name}: the last accepted draft of {len(result.steps)} passed the guard"
    except ReferenceFailed as exc:
        result.message = f"the model's reference for {op.name} does not run: {exc}"
    except LLMFailure as exc:
        result.message = f"the model could not be used ({exc}); " + (
            "keeping the last accepted draft" if result.source else f"{op.name} stays unserved")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


@dataclass
class _Coder:
    op: CustomOp
    llm: object
    calls: list | None
    ref: object
    work: Path
    target: str
    timeout_s: float
    result: CoderResult
    on_step: object = None

    def step(self, instruction: str) -> None:
        """One instruction: a draft, verified; a rejected one is shown its verdict and written
        again; if none is accepted the last accepted draft stays (the roll-back)."""
        note = ""
        for attempt in range(FIX_ATTEMPTS):
            source = self._draft(instruction + note)
            verdict = self._verify(source) if source else None
            record = {"step": len(self.result.steps), "instruction": instruction, "attempt": attempt,
                      "outcome": "kept" if verdict and verdict.get("accepted") else "rejected",
                      "verdict": verdict_line(verdict) if verdict else "no code block in the reply"}
            self.result.steps.append(record)
            if self.on_step:
                self.on_step(record)
            if record["outcome"] == "kept":
                self.result.source = source
                return
            note = ("\n\nThe verifier rejected that draft:\n" + (format_verdict(verdict)[:3000] if verdict else
                    "the reply held no ```python code block.") + "\nFix it.")
        self.result.steps[-1]["outcome"] = "rolled back" if self.result.source else "rejected"

    def _draft(self, instruction: str) -> str | None:
        return ask_for_draft(self.llm, self.op, instruction, self.result.source, self.calls, self.target)

    def _verify(self, source: str) -> dict:
        path = self.work / f"draft_{len(self.result.steps)}.py"
        path.write_text(source)
        return check_candidate(self.ref, path, self.timeout_s)


def hardware_facts(target: str | None) -> str:
    """The target's limits in one line, as the coder and debugger prompts give them."""
    hw = resolve(target)
    return (f"Target: {hw.name}, {hw.sms} SMs, {hw.smem_per_block // 1024} KB shared memory per block, "
            f"{hw.max_regs_per_thread} registers per thread, {hw.bandwidth_gbs:.0f} GB/s.")


def ask_for_draft(llm, op: CustomOp, instruction: str, current: str | None, calls: list | None,
                  target: str | None, role: str = ROLE) -> str | None:
    """The model's file for `op` under `instruction` (applied to `current`, the draft it changes),
    or None when the reply holds no code block; LLMFailure when the model cannot be used."""
    inputs = ", ".join(f"{'x'.join(map(str, i['shape']))} {i['dtype']}" for i in op.inputs)
    shown = f"\n\nThe current draft:\n```python\n{current}```" if current else ""
    text = ask(llm, prompt(role), f"Reference:\n```python\n{op.reference.strip()}\n```\nInputs: {inputs}\n"
               f"{hardware_facts(target)}{shown}\n\nInstruction: {instruction}", role=role, calls=calls)
    found = _CODE.search(text)
    return found.group(1) if found else None


def verdict_line(verdict: dict) -> str:
    failed = [f"{c['name']}: {c['detail']}" for c in verdict.get("checks", []) if c.get("passed") is False]
    return verdict.get("outcome", "?") + (f" ({failed[0][:200]})" if failed else "")
