"""Words for conv padding modes and for two-tensor formulas (an operand with its own steps), and
the extras2 bench row parsing."""
from __future__ import annotations

import pytest

from bench.tasks import EXTRAS2_TASKS
from mtmc.request.parse import parse_request


def spec_of(text: str):
    r = parse_request(text)
    assert r.spec is not None, r.message
    return r.spec


@pytest.mark.parametrize("text, mode, padding", [
    ("conv2d 3x3 reflect padding 1 on 16x64x112x112 fp16", "reflect", [[1, 1], [1, 1]]),
    ("replicate-padded 3x3 conv, padding 1, on 4x8x32x32", "replicate", [[1, 1], [1, 1]]),
    ("conv1d kernel 5 padding 2 padding_mode='circular' on 8x32x4096 bf16", "circular", [[2, 2]]),
    ("reflection padding 2 conv1d kernel 5 on 8x32x4096", "reflect", [[2, 2]]),
])
def test_padding_modes_in_words(text, mode, padding):
    spec = spec_of(text)
    assert spec.params["padding_mode"] == mode and spec.params["padding"] == padding


@pytest.mark.parametrize("text, why", [
    ("conv2d 3x3 reflect padding 5 on 1x8x4x4", "needs a larger input dim H"),
    ("transposed conv2d 3x3 circular padding 1 on 1x8x4x4", "zeros only"),
    ("conv2d 3x3 padding_mode='mirrored' padding 1 on 1x8x8x8", "nknown padding mode"),
    ("conv2d 3x3 reflect padding 1, circular padding, on 1x8x8x8", "two padding modes"),
])
def test_padding_mode_refusals(text, why):
    r = parse_request(text)
    assert r.spec is None and why in r.message


@pytest.mark.parametrize("text, chain", [
    ("relu(x) + relu(y) on two 4096x4096 fp16 tensors", [{"op": "relu"}, {"op": "add", "pre": [{"op": "relu"}]}]),
    ("x * sigmoid(y) on 8192x8192 bf16", [{"op": "mul", "pre": [{"op": "sigmoid"}]}]),
    ("x - tanh(y) on 64x64", [{"op": "sub", "pre": [{"op": "tanh"}]}]),
])
def test_two_tensor_formulas_are_one_chain(text, chain):
    assert spec_of(text).params["chain"] == chain


def test_bench_row_parses():
    assert all(parse_request(t).spec is not None for t in EXTRAS2_TASKS)
