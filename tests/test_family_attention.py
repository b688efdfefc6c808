"""The attention family: generated flash-attention kernels against PyTorch's SDPA in the
interpreter (every mask kind, chunked head dims, value slices, ragged tiles, each dtype), the
default configs' sm_90 resources, and the plain-data parts (validation, check dims, work).
Shapes stay tiny: the interpreter pays per op of every program."""
from __future__ import annotations

import pytest
from kernel_helpers import compile_defaults

from mtmc.kernels import catalog
from mtmc.kernels.families.attention import FAMILY as ATTN
from mtmc.kernels.families.attention import attention_spec, mask_dims
from mtmc.kernels.spec import KernelSpec
from mtmc.kernels.task import check
from mtmc.tools.hardware import PROFILES

H200 = PROFILES["h200"]
SMALL = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_E": 16, "BLOCK_DV": 16, "num_warps": 4, "num_stages": 2}


def assert_matches_torch(spec, **knobs):
    fam = catalog.family_of(spec)
    fam.validate(spec)
    cfg = {**fam.default_config(spec, H200), **SMALL, **knobs}
    result = check(spec, fam.render(spec, cfg), spec.dims, device="cpu", trials=1)
    assert result.ok, f"{result.reason}\nspec={spec}\nconfig={cfg}"
    return result


CASES = {  # name: (q, k, v shapes, spec options, knobs)
    "plain, ragged L and S, EV != E": ((2, 2, 19, 24), (2, 2, 35, 24), (2, 2, 35, 40), {}, {"BLOCK_E": 32, "BLOCK_DV": 64}),
    "causal, L < S": ((1, 2, 21, 16), (1, 2, 37, 16), (1, 2, 37, 16), {"mask": "causal"}, {}),
    "causal, L > S": ((1, 1, 37, 16), (1, 1, 21, 16), (1, 1, 21, 16), {"mask": "causal"}, {}),
    "additive [L, S]": ((2, 2, 20, 16), (2, 2, 33, 16), (2, 2, 33, 16), {"mask": "add", "mask_shape": (20, 33)}, {}),
    "boolean per batch": ((2, 2, 20, 16), (2, 2, 33, 16), (2, 2, 33, 16),
                          {"mask": "keep", "mask_shape": (2, 1, 20, 33), "scale": 0.3}, {}),
    "masked_fill -inf": ((1, 2, 20, 16), (1, 2, 20, 16), (1, 2, 20, 16),
                         {"mask": "fill", "mask_shape": (1, 1, 20, 20)}, {}),
    "masked_fill -5": ((1, 2, 20, 16), (1, 2, 20, 16), (1, 2, 20, 16),
                       {"mask": "fill", "mask_shape": (20, 20), "fill": -5.0}, {}),
    "head dim in chunks, value slices": ((1, 2, 18, 40), (1, 2, 18, 40), (1, 2, 18, 40), {"mask": "causal"}, {}),
    "3-D inputs": ((2, 18, 16), (2, 20, 16), (2, 20, 16), {}, {}),
}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", list(CASES))
def test_attention_matches_torch(name, dtype):
    q, k, v, opts, knobs = CASES[name]
    spec = attention_spec(q, k, v, dtype=dtype, **opts)
    if dtype == "float32":
        knobs = {**knobs, "PRECISION": "tf32x3" if "chunks" in name else "ieee"}
    if "SKIP_MASKED" in ATTN.config_space(spec):   # both ways: the skip's branch and the plain loop
        knobs = {**knobs, "SKIP_MASKED": dtype != "float16"}
    assert_matches_torch(spec, **knobs)


def test_3d_tensors_run_as_one_head():
    """A module's 3-D q, k, v reach launch() as they are: it views them as one head."""
    spec = attention_spec((2, 18, 16), (2, 20, 16), (2, 20, 16))
    assert spec.dims["H"] == 1
    import torch
    ns = {}
    exec(ATTN.render(spec, {**ATTN.default_config(spec, H200), **SMALL}), ns)
    q, k, v = torch.randn(2, 18, 16), torch.randn(2, 20, 16), torch.randn(2, 20, 16)
    out = torch.empty(2, 18, 16)
    ns["launch"](q, k, v, out=out)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v), atol=1e-4, rtol=1e-4)


def test_strided_views_are_read_in_place():
    """q, k, v as head-split views of one [B, L, 3 * H * E] projection, no copies."""
    import torch
    spec = attention_spec((2, 2, 20, 16), (2, 2, 20, 16), (2, 2, 20, 16), mask="causal")
    ns = {}
    exec(ATTN.render(spec, {**ATTN.default_config(spec, H200), **SMALL}), ns)
    qkv = torch.randn(2, 20, 3 * 32)
    q, k, v = (t.view(2, 20, 2, 16).transpose(1, 2) for t in qkv.split(32, dim=2))
    out = torch.empty(2, 2, 20, 16)
    ns["launch"](q, k, v, out=out)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mask, dtype", [("fill", "float32"), ("keep", "float16")])
def test_key_tiles_a_boolean_mask_hides_are_skipped_and_the_result_holds(mask, dtype):
    """A causal mask as a tril buffer (minGPT's masked_fill): tiles above the diagonal are
    skipped (their k and v never read); rows see only their keys."""
    import torch
    spec = attention_spec((1, 2, 40, 16), (1, 2, 40, 16), (1, 2, 40, 16), dtype=dtype, mask=mask,
                          mask_shape=(1, 1, 40, 40))
    source = ATTN.render(spec, {**ATTN.default_config(spec, H200), **SMALL, "SKIP_MASKED": True})
    assert "if tl.max(attend.to(tl.int32)) > 0:" in source
    ns = {}
    exec(source, ns)
    t = getattr(torch, dtype)
    q, k, v = (torch.randn(1, 2, 40, 16).to(t) for _ in range(3))
    tril = torch.ones(40, 40).tril().bool()
    out = torch.empty(1, 2, 40, 16, dtype=t)
    ns["launch"](q, k, v, (~tril if mask == "fill" else tril).view(1, 1, 40, 40), out=out)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    torch.testing.assert_close(out.double(), want, atol=2e-3 if dtype == "float16" else 1e-5, rtol=1e-3)


def test_check_rejects_a_kernel_that_ignores_the_causal_mask():
    spec = attention_spec((1, 1, 20, 16), (1, 1, 20, 16), (1, 1, 20, 16), mask="causal")
    cfg = {**ATTN.default_config(spec, H200), **SMALL}
    source = ATTN.render(spec, cfg)
    broken = source.replace("keep = keep & (offs_n[None, :] <= offs_m[:, None])", "keep = keep")
    assert broken != source and check(spec, source, device="cpu", trials=1).ok
    assert not check(spec, broken, device="cpu", trials=1).ok


# -- sm_90 resources of the defaults -----------------------------------------------------------------
COMPILE_SPECS = {
    "E=256 no mask": attention_spec((32, 32, 512, 256), (32, 32, 512, 256), (32, 32, 512, 256)),
    "mingpt causal E=96": attention_spec((128, 8, 512, 96), (128, 8, 512, 96), (128, 8, 512, 96), mask="causal"),
    "E=64 additive": attention_spec((16, 16, 2048, 64), (16, 16, 2048, 64), (16, 16, 2048, 64), mask="add"),
    "E=128 boolean": attention_spec((8, 16, 1024, 128), (8, 16, 1024, 128), (8, 16, 1024, 128), mask="keep",
                                    mask_shape=(8, 1, 1, 1024)),
    "mingpt masked_fill E=96": attention_spec((128, 8, 512, 96), (128, 8, 512, 96), (128, 8, 512, 96), mask="fill",
                                              mask_shape=(1, 1, 512, 512)),
    "masked_fill E=64": attention_spec((16, 16, 1024, 64), (16, 16, 1024, 64), (16, 16, 1024, 64), mask="fill",
                                       mask_shape=(1, 1, 1024, 1024)),
    "E=256 causal": attention_spec((4, 8, 1024, 256), (4, 8, 1024, 256), (4, 8, 1024, 256), mask="causal"),
}

def test_default_configs_compile_for_sm90_without_spills_and_within_shared_memory():
    specs = {}
    for name, spec in COMPILE_SPECS.items():
        for dtype in ("float32", "float16", "bfloat16"):
            specs[f"{name} {dtype}"] = {**spec.to_dict(), "dtype": dtype}
    reports = compile_defaults(specs)
    for name, report in reports.items():
        (kernel,) = [k for k in report["kernels"] if k["name"] == "attention_kernel"]
        assert kernel["error"] is None, f"{name}: {kernel['error']}"
        assert report["violations"] == [], f"{name}: {report['violations']}"
        assert kernel["spill_bytes"] == 0 and 0 <= kernel["shared_bytes"] <= H200.smem_per_block, (name, kernel)
        assert kernel["regs"] <= 255, name


# -- the plain-data parts -----------------------------------------------------------------------------
@pytest.mark.parametrize("change, match", [
    ({"params": {"dropout": 0.1}}, "dropout"),
    ({"params": {"mask": "sliding"}}, "not one of"),
    ({"params": {"mask": "add", "mask_shape": [1, 1, "S", "L"]}}, "mask_shape"),
    ({"params": {"mask": "causal", "mask_shape": [1, 1, "L", "S"]}}, "takes no mask tensor"),
    ({"params": {"scale": float("nan")}}, "finite"),
    ({"dims": {"E": 2048}}, "head dim"),
    ({"dims": {"EV": 512}}, "above 256"),
    ({"dims": {"S": 0}}, "positive"),
    ({"params": {"enable_gqa": True}}, "grouped-query"),
])
def test_validate_rejects_bad_specs(change, match):
    d = attention_spec((2, 4, 8, 16), (2, 4, 8, 16), (2, 4, 8, 16)).to_dict()
    for key, value in change.items():
        d[key] = {**d[key], **value}
    with pytest.raises(ValueError, match=match):
        ATTN.validate(KernelSpec.from_dict(d))


def test_mask_dims_broadcast_or_say_why():
    dims = {"B": 2, "H": 4, "L": 8, "S": 16}
    assert mask_dims((8, 16), dims) == [1, 1, "L", "S"]
    assert mask_dims((2, 1, 1, 16), dims) == ["B", 1, 1, "S"]
    with pytest.raises(ValueError, match="does not broadcast"):
        mask_dims((3, 16), dims)


def test_check_dims_work_and_defaults():
    spec = attention_spec((32, 32, 512, 1024), (32, 32, 512, 1024), (32, 32, 512, 1024))
    cfg = ATTN.default_config(spec, H200)
    # one value slice: q @ k^T computed once; the head dim walked in chunks
    assert cfg["BLOCK_E"] < 1024 and cfg["BLOCK_DV"] == 1024 and cfg["PRECISION"] == "tf32x3"
    dims = ATTN.check_dims(spec, cfg)
    assert dims["B"] == dims["H"] == 2 and dims["E"] < 1024 and dims["L"] < 512
    causal = attention_spec((1, 1, 64, 64), (1, 1, 64, 64), (1, 1, 64, 64), mask="causal")
    full = attention_spec((1, 1, 64, 64), (1, 1, 64, 64), (1, 1, 64, 64))
    assert ATTN.work(causal)[0] < 0.6 * ATTN.work(full)[0]
    small = attention_spec((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16))
    assert ATTN.check_dims(small, ATTN.default_config(small, H200)) == small.dims


def test_roofline_estimate_knows_the_attention_loop_and_tensor_cores():
    from mtmc.kernels.estimate import estimate_time
    spec = attention_spec((16, 16, 4096, 64), (16, 16, 4096, 64), (16, 16, 4096, 64), dtype="float16", mask="causal")
    est = estimate_time(spec, ATTN.default_config(spec, H200), H200)
    assert est["feasible"] and est["ideal_ms"] <= est["ms"] < 3 * est["ideal_ms"]   # tensor-core peak, S / BLOCK_N steps


@pytest.mark.parametrize("mask", ["keep", "fill"])
def test_a_row_masked_wholly_gives_what_its_pytorch_form_gives(mask):
    """SDPA's boolean mask: 0 for a query that sees no key; masked_fill + softmax: NaN."""
    import torch
    spec = attention_spec((1, 1, 3, 16), (1, 1, 5, 16), (1, 1, 5, 16), mask=mask, mask_shape=(3, 5))
    ns = {}
    exec(ATTN.render(spec, {**ATTN.default_config(spec, H200), **SMALL}), ns)
    keep = torch.tensor([[True] * 5, [False] * 5, [True, False] * 2 + [True]])
    q, k, v = torch.randn(1, 1, 3, 16), torch.randn(1, 1, 5, 16), torch.randn(1, 1, 5, 16)
    out = torch.empty(1, 1, 3, 16)
    ns["launch"](q, k, v, keep if mask == "keep" else ~keep, out=out)
    ref = {}
    exec(ATTN.reference_source(spec), {"torch": torch, "math": __import__("math")}, ref)
    want = ref["reference"](q, k, v, keep if mask == "keep" else ~keep)
    torch.testing.assert_close(out, want, equal_nan=True, atol=1e-5, rtol=1e-5)
    assert bool(out[0, 0, 1].isnan().all()) == (mask == "fill")


def test_the_default_scale_follows_the_head_dim_at_the_cut_check_dims():
    """L1 97 (E = 1024, no scale given) failed every check: its reference took 1/sqrt(1024) from
    the spec while the kernel, at the check's cut dims (E = 64), took 1/sqrt(64) from q."""
    spec = KernelSpec("attention", "sdpa", {"B": 1, "H": 2, "L": 64, "S": 64, "E": 256, "EV": 256}, "float32",
                      {"mask": "none", "scale": None})
    cfg = {**ATTN.default_config(spec, PROFILES["h200"]), "BLOCK_E": 32}
    dims = ATTN.check_dims(spec, cfg)
    assert dims["E"] < spec.dims["E"]
    assert check(spec, ATTN.render(spec, cfg), dims).ok
    given = KernelSpec.from_dict({**spec.to_dict(), "params": {"mask": "none", "scale": 0.125}})
    assert check(given, ATTN.render(given, cfg), dims).ok   # a given scale stays what it was
