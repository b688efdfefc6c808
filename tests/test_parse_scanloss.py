"""Scan and loss requests in words -> the scan and loss families' specs, and refusals."""
from __future__ import annotations

import pytest

from mtmc.request.parse import parse_request


@pytest.mark.parametrize("text, family, op, dims, dtype, params", [
    ("cumsum along the rows of a 128x32768 fp32 tensor", "scan", "cumsum", (128, 32768), "float32", {}),
    ("reverse cumulative sum of a 32768x32768 tensor", "scan", "cumsum", (32768, 32768), "float32", {"reverse": True}),
    ("exclusive prefix sum over the last dim of a 4096x8192 bf16 tensor", "scan", "cumsum", (4096, 8192), "bfloat16",
     {"exclusive": True}),
    ("masked cumsum of a 32768x32768 float32 tensor", "scan", "cumsum", (32768, 32768), "float32", {"masked": True}),
    ("cumprod of a [8, 128, 1024] fp16 tensor", "scan", "cumprod", (1024, 1024), "float16", {}),
    ("cross entropy loss of 32768x4096 logits", "loss", "cross_entropy", (32768, 4096), "float32", {}),
    ("triplet margin loss with margin 0.5 on 32768x8192 fp32 embeddings", "loss", "triplet_margin", (32768, 8192),
     "float32", {"margin": 0.5}),
    ("mse loss of two 32768x32768 tensors", "loss", "mse", (32768, 32768), "float32", {}),
    ("huber loss delta 0.5, sum reduction, 8192x8192 fp16", "loss", "huber", (8192, 8192), "float16",
     {"delta": 0.5, "reduction": "sum"}),
    ("kl divergence with batchmean reduction of 32768x4096 probabilities", "loss", "kl_div", (32768, 4096),
     "float32", {"reduction": "batchmean"}),
    ("cosine similarity loss of 32768x8192", "loss", "cosine_similarity", (32768, 8192), "float32",
     {"epilogue": [{"op": "neg"}, {"op": "shift", "value": 1.0}]}),
    ("cosine similarity of 4096x1024 rows", "loss", "cosine_similarity", (4096, 1024), "float32", {"reduction": "none"}),
    ("hinge loss of 32768x32768", "loss", "total", (32768, 32768), "float32", {}),
    ("cross entropy with ignore index 3 and no reduction on 1024x50257 logits", "loss", "cross_entropy",
     (1024, 50257), "float32", {"reduction": "none", "ignore_index": 3}),
    ("cross entropy with label smoothing 0.1, 4096 rows over 1000 classes", "loss", "cross_entropy",
     (4096, 1000), "float32", {"label_smoothing": 0.1}),
])
def test_requests_parse_to_specs(text, family, op, dims, dtype, params):
    r = parse_request(text)
    assert r.ok, r.message
    s = r.spec
    assert (s.family, s.op, (s.dims["M"], s.dims["N"]), s.dtype) == (family, op, dims, dtype)
    assert all(s.params.get(k) == v for k, v in params.items()), s.params


@pytest.mark.parametrize("text, words", [
    ("cumsum over dim 0 of a 64x64 tensor", "last dim"),
    ("reverse mse loss of 64x64", "not something"),
    ("huber loss delta 0 of 64x64", "delta > 0"),
    ("kl divergence and a softmax of 64x64", "different kinds"),
])
def test_refusals_say_why(text, words):
    r = parse_request(text)
    assert not r.ok and words in r.message, r.message
