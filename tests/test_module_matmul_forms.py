"""More spellings of matrix products in uploaded modules: einsum with an implicit output,
tensordot, diag(v) @ B / B @ diag(v) as row / column scalings (no [N, N] matrix), and
matrix-vector products as row reductions sum(A * v) (one pass over A), each
checked as ModelNew against Model in the interpreter; tensordot forms that are not a matmul
stay PyTorch with the reason; a one-value parameter after nn.Linear is read by the epilogue."""
from __future__ import annotations

import pytest
import torch
from test_module_conv import (PARAMETER_TAIL, assert_model_new_matches, assert_one_value_read_at_run_time,
                              captured_source)

FORM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, A, B):
        return {expr}


def get_inputs():
    return [torch.randn({a}), torch.randn({b})]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("expr, a, b, groups", [
    ("torch.einsum('ij,jk', A, B)", "16, 24", "24, 20", [("matmul", "matmul", "kn")]),
    ("torch.tensordot(A, B, dims=([1], [0]))", "16, 24", "24, 20", [("matmul", "matmul", "kn")]),
    ("torch.tensordot(A, B, dims=1)", "2, 8, 24", "24, 20", [("matmul", "matmul", "kn")]),
    ("torch.tensordot(A, B, dims=([-1], [1]))", "16, 24", "20, 24", [("matmul", "matmul", "nk")]),
    ("torch.relu(torch.diag(A) @ B)", "16", "16, 20", [("elementwise", "chain", None)]),
    ("B @ torch.diag(A)", "20", "16, 20", [("elementwise", "chain", None)]),
    ("B @ A", "24", "16, 24", [("reduction", "sum", None)]),
    ("torch.mv(B, A) * 2.0", "24", "16, 24", [("reduction", "sum", None), ("elementwise", "chain", None)]),
    ("torch.matmul(B, A)", "24", "2, 3, 24", [("reduction", "sum", None)]),
])
def test_matmul_spellings_become_kernels(expr, a, b, groups, tmp_path):
    source = FORM.format(expr=expr, a=a, b=b)
    cap, part = captured_source(tmp_path, source)
    assert [(g.family, g.spec["op"], g.spec["params"].get("b_layout")) for g in part.groups] == groups
    assert part.torch_ops == []   # diag's [N, N] matrix is never made
    assert_model_new_matches(tmp_path, source, cap, part)


def test_diag_matmul_is_a_row_scaling_read_in_place(tmp_path):
    _, part = captured_source(tmp_path, FORM.format(expr="torch.diag(A) @ B", a="16", b="16, 20"))
    (g,) = part.groups
    assert g.spec["params"]["chain"] == [{"op": "mul", "every": 20, "period": 16}]
    assert [i["view"] for i in g.inputs] == ["rows", "periodic"]


def test_tensordot_that_is_not_a_matmul_stays_pytorch(tmp_path):
    _, part = captured_source(tmp_path, FORM.format(expr="torch.tensordot(A, B, dims=([0], [0]))",
                                                   a="24, 16", b="24, 20"))
    assert part.groups == [] and "contracts a dim other than a's last" in part.torch_ops[0]["why"]


def test_a_one_value_parameter_in_a_linear_epilogue_is_read_at_run_time(tmp_path):
    source = PARAMETER_TAIL.format(op="nn.Linear(24, 20)", p="torch.tensor([0.5])", forward="self.op(x) + self.p",
                                   x="3, 5, 24")
    # the [1] shift is loaded once by the tile, not expanded to [3, 5, 20] first
    (g,) = assert_one_value_read_at_run_time(tmp_path, source, torch.tensor([-2.0]))
    assert (g.family, g.spec["params"]["epilogue"]) == ("matmul", [{"op": "bias"}, {"op": "add", "scalar": True}])


def test_addmm_of_a_column_vector_is_a_matmul_with_its_bias(tmp_path):
    """torch.addmm(bias, x, w), Hugging Face GPT-2's Conv1D layer, stayed PyTorch as "outside the
    kernel catalog" (tried as a user's upload, 2026-12-06); and the GELU after its view back to
    [batch, seq, N] ran as a kernel of its own."""
    from pathlib import Path

    from mtmc.module.capture import capture
    from mtmc.module.fusion import partition
    path = Path(__file__).parent / "modules" / "gpt2_mlp.py"
    cap = capture(str(path))
    part = partition(cap)
    mm = [g for g in part.groups if g.family == "matmul"]
    assert len(mm) == len(part.groups) == 3 and all(g.spec["params"]["epilogue"][0] == {"op": "bias"} for g in mm[:2])
    # x.view(-1, K) before and .view(*lead, N) after: the matmul of x, so the tanh GELU is its epilogue
    assert [s["op"] for s in mm[0].spec["params"]["epilogue"]] == ["bias", "gelu_tanh"]   # recognized, written out
    # beta * v + a @ b: written out at capture (module.decompose), the scaled add is the mm's epilogue
    assert part.torch_ops == [] and "add" in [s["op"] for s in mm[2].spec["params"]["epilogue"]]
    assert_model_new_matches(tmp_path, path.read_text(), cap, part,
                             changed={"c_fc.bias": torch.randn(128), "c_proj.weight": torch.randn(128, 32)})
