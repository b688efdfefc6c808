"""The coder role with a model (issue 18): an op outside the catalog goes from words to a kernel
the guard accepted, through scripted replies of the loopback `chat_server` (the real ChatOpenAI
client): the parser role gives the reference, the coder role the drafts; a draft that calls torch
for the work is rejected by the guard and fixed, a reply without code rolls back to the last
accepted draft."""
import json

from mtmc.agents.llm_coder import MACRO_STEPS, reference_module, write_kernel
from mtmc.request.llm_parse import custom_op, read_request
from mtmc.tools import llm as chat_model

WORDS = "a custom activation x * tanh(softplus(x)) ** 2 on a 16x64 float32 tensor"
REFERENCE = "def reference(x):\n    return x * torch.tanh(F.softplus(x)) ** 2\n"
PARSED = json.dumps({"custom": {"name": "tanh_softplus_sq", "reference": REFERENCE,
                                "inputs": [{"shape": [16, 64], "dtype": "float32"}]}})


def kernel(block: int, warps: int = 4) -> str:
    return f'''```python
import torch
import triton
import triton.language as tl


@triton.jit
def act_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    sp = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    t = 1.0 - 2.0 / (tl.exp(2.0 * sp) + 1.0)
    tl.store(y_ptr + offs, (x * t * t).to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        n = x.numel()
        act_kernel[(triton.cdiv(n, {block}),)](x, y, n, BLOCK={block}, num_warps={warps})
        return y
```'''


CHEAT = '''```python
import torch
import torch.nn.functional as F


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x * torch.tanh(F.softplus(x)) ** 2
```'''


def test_the_reference_module_is_what_the_guard_takes_as_model():
    source = reference_module(custom_op(json.loads(PARSED)["custom"]))
    namespace = {}
    exec(source, namespace)
    import torch
    x, = namespace["get_inputs"]()
    assert x.shape == (16, 64) and namespace["get_init_inputs"]() == []
    assert torch.allclose(namespace["Model"]()(x), x * torch.tanh(torch.nn.functional.softplus(x)) ** 2)


def test_an_op_outside_the_catalog_goes_from_words_to_a_guarded_kernel(chat_server):
    llm = chat_model.build(chat_server.url, "stub-model", timeout_s=10)
    chat_server.script = [("ok", PARSED),                         # parser: the reference
                          ("ok", kernel(256)),                    # coder: first draft -> kept
                          ("ok", CHEAT), ("ok", kernel(512)),     # step 1: torch cheat rejected, then fixed
                          ("ok", "Sure, here it is!"), ("ok", "no code again")]   # step 2: nothing usable
    calls = []
    result, custom = read_request(WORDS, llm, calls)
    assert custom is not None and custom.name == "tanh_softplus_sq"
    coded = write_kernel(custom, llm, calls)
    outcomes = [(s["instruction"][:12], s["outcome"]) for s in coded.steps]
    assert outcomes == [("Write the fi", "kept"), (MACRO_STEPS[0][:12], "rejected"), (MACRO_STEPS[0][:12], "kept"),
                        (MACRO_STEPS[1][:12], "rejected"), (MACRO_STEPS[1][:12], "rolled back")], coded.steps
    assert "BLOCK=512" in coded.source                                     # the last accepted draft
    assert "own_kernels" in coded.steps[1]["verdict"] or "torch" in coded.steps[1]["verdict"]
    assert "The verifier rejected that draft" in chat_server.prompt(3)     # the fix saw the verdict
    assert "132 SMs" in chat_server.prompt(1) and "Instruction: Write the first draft." in chat_server.prompt(1)
    assert [c["role"] for c in calls] == ["parser"] + ["coder"] * 5 and all(c["ok"] for c in calls)


def test_a_dead_endpoint_leaves_the_op_unserved_with_the_reason(chat_server):
    chat_server.close()
    op = custom_op(json.loads(PARSED)["custom"])
    coded = write_kernel(op, chat_model.build(chat_server.url, "stub-model", timeout_s=1))
    assert coded.source is None and coded.message.startswith("the model could not be used (connection refused)")


HANG = '''```python
import torch
import triton


class ModelNew(torch.nn.Module):
    def forward(self, x):
        while True:
            pass
```'''

BROKEN = "```python\nimport torch\nclass ModelNew(torch.nn.Module:\n    pass\n```"


def test_a_hanging_draft_and_one_that_does_not_compile_are_refused_and_rolled_back(chat_server):
    """The hang is killed at the guard's timeout and shown as the verdict; the syntax error too;
    the run keeps the last accepted draft."""
    llm = chat_model.build(chat_server.url, "stub-model", timeout_s=10)
    chat_server.script = [("ok", HANG), ("ok", kernel(256)),       # first draft: hangs, then fixed
                          ("ok", BROKEN), ("ok", BROKEN)]           # step 1: never compiles: rolled back
    op = custom_op(json.loads(PARSED)["custom"])
    coded = write_kernel(op, llm, steps=1, timeout_s=20)
    assert [s["outcome"] for s in coded.steps] == ["rejected", "kept", "rejected", "rolled back"], coded.steps
    assert "timed out" in coded.steps[0]["verdict"] or "timeout" in coded.steps[0]["verdict"], coded.steps[0]
    assert "BLOCK=256" in coded.source
    assert "The verifier rejected that draft" in chat_server.prompt(1)
