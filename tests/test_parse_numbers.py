"""The rule parser reads batched products said with "times" and element counts written with
separators, powers or suffixes (issue 18: "8 batches of 64x128 times 128x96" was an elementwise
multiply, "1,000,000 float32 elements" a size 000)."""
import pytest

from mtmc.request.parse import parse_request


@pytest.mark.parametrize("text, op, dims", [
    ("8 batches of 64x128 times 128x96", "bmm", {"B": 8, "M": 64, "K": 128, "N": 96}),
    ("batched matmul of 8 batches of 64x128 times 128x96 in fp16", "bmm", {"B": 8, "M": 64, "K": 128, "N": 96}),
    ("64x128 times 128x96", "matmul", {"M": 64, "K": 128, "N": 96}),
    ("a 64x128 multiplied by a 128x96 in bf16", "matmul", {"M": 64, "K": 128, "N": 96}),
    ("8x64x128 times 8x128x96", "bmm", {"B": 8, "M": 64, "K": 128, "N": 96}),
    ("64x128 times 128x96, then relu", "matmul", {"M": 64, "K": 128, "N": 96}),
])
def test_shapes_joined_by_times_with_agreeing_inner_dims_are_a_matrix_product(text, op, dims):
    result = parse_request(text)
    assert result.ok, result.message
    assert (result.spec.family, result.spec.op, result.spec.dims) == ("matmul", op, dims)


def test_square_shapes_times_each_other_say_which_product_was_read():
    result = parse_request("64x64 times 64x64")
    assert result.spec.op == "matmul" and any("elementwise" in a for a in result.assumptions)
    for text in ("64x64 times 64x64 elementwise", "64x128 times 64x128"):   # said, or the only reading
        spec = parse_request(text).spec
        assert (spec.family, spec.params["chain"]) == ("elementwise", [{"op": "mul"}]), text


def test_times_a_number_is_still_a_scale():
    assert parse_request("a 64x64 tensor times 3").spec.params["chain"] == [{"op": "scale", "value": 3.0}]
    assert not parse_request("a 64x128 times 64x96").ok      # neither product: refused, not guessed


@pytest.mark.parametrize("count, n", [
    ("1,000,000 float32 elements", 1000000), ("1 000 000 float32 elements", 1000000),
    ("1e6 elements", 1000000), ("2^20 fp16 values", 1 << 20), ("4M elements", 4 << 20),
    ("16k elements", 16384), ("4 million floats", 4000000), ("1,048,576 random values", 1 << 20),
])
def test_element_counts(count, n):
    result = parse_request(f"relu on {count}")
    assert result.ok, result.message
    assert result.spec.params["shape"] == [n]


def test_suffixes_are_binary_and_said_so():
    result = parse_request("softmax over 1m rows of width 2k")
    assert result.spec.dims == {"M": 1 << 20, "N": 2048}
    assert "read '1m' as 1048576 (m = 2^20)" in result.assumptions


def test_separators_count_rows_but_never_split_shapes():
    assert parse_request("softmax over 1,024 rows of width 4096").spec.dims == {"M": 1024, "N": 4096}
    assert parse_request("layernorm on a (8,128,128) tensor").spec.dims == {"M": 1024, "N": 128}
    assert parse_request("layernorm on a [8,128,128] tensor").spec.dims == {"M": 1024, "N": 128}
