"""Attention requests in words -> the attention family's spec, and the plain-words refusals."""
from __future__ import annotations

import pytest

from mtmc.request.parse import EXAMPLES, parse_request


@pytest.mark.parametrize("text, dims, params, dtype", [
    ("causal flash attention, batch 8, 16 heads, sequence length 2048, head dim 64, fp16",
     {"B": 8, "H": 16, "L": 2048, "S": 2048, "E": 64, "EV": 64}, {"mask": "causal", "scale": None}, "float16"),
    ("scaled dot product attention on q, k, v of shape 32x32x512x64 in bf16",
     {"B": 32, "H": 32, "L": 512, "S": 512, "E": 64, "EV": 64}, {"mask": "none", "scale": None}, "bfloat16"),
    ("multi-head attention with 12 heads over 4x1024x768 fp16 activations, causal",
     {"B": 4, "H": 12, "L": 1024, "S": 1024, "E": 64, "EV": 64}, {"mask": "causal"}, "float16"),
    ("sdpa with an additive mask, q 8x16x1024x128 and k/v 8x16x4096x128, scale 0.1",
     {"B": 8, "H": 16, "L": 1024, "S": 4096, "E": 128, "EV": 128},
     {"mask": "add", "scale": 0.1, "mask_shape": [1, 1, "L", "S"]}, "float32"),
    ("flash attention 2x4x128x64 fp16 with a boolean mask", {"B": 2, "H": 4, "L": 128, "S": 128, "E": 64, "EV": 64},
     {"mask": "keep"}, "float16"),
    ("self-attention, d_model 768, 12 heads, batch 4, seq len 1024, no dropout",
     {"B": 4, "H": 12, "L": 1024, "S": 1024, "E": 64, "EV": 64}, {"mask": "none"}, "float32"),
])
def test_attention_words_parse_to_the_spec(text, dims, params, dtype):
    r = parse_request(text)
    assert r.ok, r.message
    assert (r.spec.family, r.spec.op, r.spec.dims, r.spec.dtype) == ("attention", "sdpa", dims, dtype)
    assert {k: r.spec.params.get(k) for k in params} == params


@pytest.mark.parametrize("text, words", [
    ("attention with dropout 0.1 on 8x16x1024x64", "dropout is random"),
    ("attention on 8x16x1024x64 then relu", "fuses no pointwise ops"),
    ("attention, batch 8, sequence length 2048", "the number of heads, the head dim"),
    ("causal attention on a 8x16x1024x2048 tensor", "head dim E=2048"),
    ("causal attention with an additive mask on 2x4x128x64", "two masks"),
    ("attention on q 2x4x128x64 and k 2x8x128x64", "do not match"),
])
def test_attention_refusals_say_why(text, words):
    r = parse_request(text)
    assert not r.ok and words in r.message, r.message


def test_examples_parse():
    for text in EXAMPLES["attention"]:
        assert parse_request(text).ok, text


def test_the_attention_benchmark_row_parses_and_is_registered():
    from bench.run import TASKS
    from bench.tasks import ATTENTION_TASKS
    assert TASKS["attention"] is ATTENTION_TASKS
    for text in ATTENTION_TASKS:
        r = parse_request(text)
        assert r.ok and r.spec.family == "attention", (text, r.message)
