"""Attention in uploaded modules: F.scaled_dot_product_attention in its call forms, the
hand-written softmax(q @ k^T * s [masked_fill]) @ v, and nn.MultiheadAttention (expanded at
capture into projections + SDPA) become attention groups; near misses stay PyTorch with the
reason; ModelNew with the template kernels computes what Model does (interpreter), and one
module runs through optimize end to end with the guard passing."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_module_conv import assert_model_new_matches, captured_source

from mtmc.agents.context import Context
from mtmc.agents.module_flow import optimize_module
from mtmc.module.capture import capture
from mtmc.module.fusion import partition

MODULES = Path(__file__).parent / "modules"

SDPA = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, q, k, v, mask):
        return {call}


def get_inputs():
    return [torch.randn({q}), torch.randn({k}), torch.randn({k}), {mask}]


def get_init_inputs():
    return []
"""

FORMS = {  # call, q shape, k/v shape, mask, expected params
    "positional": ("F.scaled_dot_product_attention(q, k, v)", "2, 2, 9, 16", "2, 2, 11, 16", "None",
                   {"mask": "none", "scale": None}),
    "keywords, causal, scale": ("F.scaled_dot_product_attention(query=q, key=k, value=v, is_causal=True, scale=0.3)",
                                "2, 2, 9, 16", "2, 2, 9, 16", "None", {"mask": "causal", "scale": 0.3}),
    "boolean mask, 3-D": ("torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)",
                          "2, 9, 16", "2, 11, 16", "torch.rand(9, 11) < 0.8",
                          {"mask": "keep", "mask_shape": [1, 1, "L", "S"]}),
    "additive mask, dropout 0": ("F.scaled_dot_product_attention(q, k, v, mask, 0.0)", "2, 2, 9, 16",
                                 "2, 2, 11, 16", "torch.randn(2, 1, 9, 11)", {"mask": "add", "mask_shape": ["B", 1, "L", "S"]}),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_sdpa_call_forms_are_attention_groups(form, tmp_path):
    call, q, k, mask, params = FORMS[form]
    source = SDPA.format(call=call, q=q, k=k, mask=mask)
    cap, part = captured_source(tmp_path, source)
    (g,) = part.groups
    assert g.family == "attention" and part.torch_ops == []
    assert {key: g.spec["params"].get(key) for key in params} == params
    assert all(i["view"] == "as_is" for i in g.inputs)   # read through strides
    assert_model_new_matches(tmp_path, source, cap, part)


REFUSED = {  # call: words of the reason
    "F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)": "dropout_p > 0 is random",
    "F.scaled_dot_product_attention(q, k, v, enable_gqa=True)": "grouped-query",
    "F.scaled_dot_product_attention(q[None], k[None], v[None])": "5-D q",
}


@pytest.mark.parametrize("call", list(REFUSED))
def test_near_misses_stay_pytorch_with_the_reason(call, tmp_path):
    source = SDPA.format(call=call, q="1, 2, 4, 16", k="1, 2, 4, 16", mask="torch.randn(4, 4)")
    _, part = captured_source(tmp_path, source)
    assert part.groups == []
    (op,) = part.torch_ops
    assert REFUSED[call] in op["why"], op


def test_mingpt_attention_is_one_group_between_its_projections():
    part = partition(capture(str(MODULES / "mingpt_attention.py")))
    qkv, att, proj = part.groups
    assert (qkv.family, att.family, proj.family) == ("matmul", "attention", "matmul")
    p = att.spec["params"]
    assert p["mask"] == "fill" and p["fill"] == float("-inf") and p["mask_shape"] == [1, 1, "L", "S"]
    assert p["scale"] == pytest.approx(1 / math.sqrt(16))
    # the scale computed from k.size(-1) is baked in and guarded; the matmuls, scale,
    # masked_fill and softmax are all inside the group (dropout(p=0) is read past as an identity)
    assert len(att.guards) == 1 and att.guards[0]["value"] == pytest.approx(1 / math.sqrt(16))
    assert [o.split(" ")[0] for o in att.ops] == ["matmul", "mul", ".masked_fill()", "softmax", "matmul"]
    # only the mask's comparison stays PyTorch (a [1, 1, T, T] bool the kernel reads in place)
    assert [o["op"].split(" ")[0] for o in part.torch_ops] == ["eq"]
    # said so (it read "outside the kernel catalog", so a configured LLM was asked to write it)
    assert part.torch_ops[0]["why"].startswith("a comparison making a boolean mask")
    # y.transpose(1, 2).contiguous(): the kernel writes [B, T, H, hs], so that copy is a no-op
    assert att.out == {"kind": "attention", "perm": [0, 2, 1, 3]}


def test_attention_output_stored_in_its_users_order_is_the_same_tensor():
    import torch

    from mtmc.module.attention_fusion import out_lines
    ns = {"torch": torch, "k0": torch.empty(2, 3, 5, 8), "k2": torch.empty(2, 3, 7, 4)}
    exec("\n".join(out_lines({"kind": "attention", "perm": [0, 2, 1, 3]}, "dtype=torch.float32")), ns)
    assert ns["out"].shape == (2, 3, 5, 4) and ns["out"].transpose(1, 2).is_contiguous()


MHA = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 4, batch_first={batch_first}, bias={bias})

    def forward(self, x, y):
        {body}


def get_inputs():
    return [torch.randn({x}), torch.randn({y})]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("batch_first, bias, body, groups", [
    (True, True, "return self.attn(x, x, x, need_weights=False)[0]", ["matmul", "attention", "matmul"]),
    (False, False, "out, _ = self.attn(x, y, y)\n        return out", ["matmul"] * 3 + ["attention", "matmul"]),
])
def test_multihead_attention_becomes_projections_around_an_attention_group(batch_first, bias, body, groups,
                                                                           tmp_path):
    x, y = ("2, 6, 32", "2, 7, 32") if batch_first else ("6, 2, 32", "7, 2, 32")
    source = MHA.format(batch_first=batch_first, bias=bias, body=body, x=x, y=y)
    cap, part = captured_source(tmp_path, source)
    assert [g.family for g in part.groups] == groups and part.torch_ops == []
    assert_model_new_matches(tmp_path, source, cap, part)


def test_multihead_attention_whose_weights_are_used_stays_pytorch(tmp_path):
    source = MHA.format(batch_first=True, bias=True, body="out, w = self.attn(x, y, y)\n        return out, w",
                        x="2, 6, 32", y="2, 7, 32")
    _, part = captured_source(tmp_path, source)
    assert part.groups == []
    (op,) = part.torch_ops
    assert "MultiheadAttention" in op["op"] and "weights are used" in op["why"]


@pytest.mark.slow
def test_mha_block_end_to_end_through_optimize(tmp_path):
    summary = optimize_module(str(MODULES / "mha_block.py"), Context(target="h200", max_steps=0),
                              str(tmp_path / "new.py"))
    assert summary["status"] == "done", summary.get("message")
    assert summary["check"]["status"] == "passed", summary["check"]
    assert [g["family"] for g in summary["groups"]] == ["matmul", "attention", "matmul", "norm"]
    assert all(g["status"] == "kernel" for g in summary["groups"])


ENCODER = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = {module}

    def forward(self, x):
        return self.enc(x)


def get_inputs():
    return [torch.randn(2, 6, 32)]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("module, families", [
    ("nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0), num_layers=2)",
     ["matmul", "attention", "matmul", "norm", "matmul", "matmul", "norm"] * 2),
    ("nn.TransformerEncoderLayer(32, 2, 48, dropout=0.0, activation='gelu', batch_first=True, norm_first=True)",
     ["norm", "matmul", "attention", "matmul", "norm", "matmul", "matmul"]),
])
def test_transformer_encoders_are_traced_as_their_parts(module, families, tmp_path):
    """ViT-style encoders (KernelBench level 3): each layer's attention, projections, MLP and norms."""
    source = ENCODER.format(module=module)
    cap, part = captured_source(tmp_path, source)
    assert [g.family for g in part.groups] == families and part.torch_ops == []
    assert_model_new_matches(tmp_path, source, cap, part)


def test_an_encoder_layer_with_dropout_in_training_mode_stays_pytorch_with_the_reason(tmp_path):
    _, part = captured_source(tmp_path, ENCODER.format(module="nn.TransformerEncoderLayer(32, 2, 48)"))
    assert part.groups == [] and "training mode with dropout" in part.torch_ops[0]["why"]


HAND_WRITTEN = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, q, k, v, mask):
        {body}


def get_inputs():
    return [torch.randn(2, 3, 9, 16), torch.randn(2, 3, 11, 16), torch.randn(2, 3, 11, 8), torch.randn(9, 11)]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("body, params", [
    ("return torch.softmax((q * 0.25) @ k.transpose(-2, -1), dim=-1) @ v", {"mask": "none", "scale": 0.25}),
    ("s = torch.einsum('bhid,bhjd->bhij', q, k) / 4.0 + mask\n        return torch.einsum('bhij,bhjd->bhid', "
     "s.softmax(-1), v)", {"mask": "add", "scale": 0.25, "mask_shape": [1, 1, "L", "S"]}),
    ("return torch.softmax(q @ k.permute(0, 1, 3, 2) / 4, -1) @ v", {"mask": "none", "scale": 0.25}),
    ("s = (q @ k.transpose(-2, -1)).masked_fill(mask > 1.0, -1e4) * 0.5\n        return torch.matmul("
     "torch.softmax(s, dim=-1), v)", {"mask": "fill", "scale": 0.5, "fill": -5e3}),
])
def test_hand_written_attention_forms(body, params, tmp_path):
    source = HAND_WRITTEN.format(body=body)
    cap, part = captured_source(tmp_path, source)
    att = [g for g in part.groups if g.family == "attention"]
    assert len(att) == 1 and {k: att[0].spec["params"].get(k) for k in params} == params, part.groups
    assert_model_new_matches(tmp_path, source, cap, part)


def test_scores_scaled_after_an_added_mask_are_not_sdpa(tmp_path):
    """(q @ k^T + mask) * s scales the mask too: two matmuls and a softmax, not attention."""
    source = HAND_WRITTEN.format(body="return torch.softmax((q @ k.transpose(-2, -1) + mask) * 0.5, -1) @ v")
    _, part = captured_source(tmp_path, source)
    assert "attention" not in [g.family for g in part.groups]
