"""The conv family: generated kernels against torch.nn.functional in the interpreter, and the
default configs' sm_90 resources.

Every kernel check goes through mtmc.tools.correctness.check (fresh random inputs, a NaN-filled
output, a float64 reference with an |x| conv |w| error scale), so a test passes only when the
rendered source computes the spec.  Shapes stay tiny: the interpreter costs milliseconds per op
of every loop iteration of every program.
"""
from __future__ import annotations


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtmc.kernels import catalog
from mtmc.kernels.families.conv import FAMILY as CONV
from mtmc.kernels.families.conv import OPS, conv_spec, is_transposed, out_size, rank
from mtmc.kernels.spec import KernelSpec
from mtmc.kernels.task import check
from kernel_helpers import compile_defaults
from mtmc.tools.hardware import PROFILES

H200 = PROFILES["h200"]
PROPERTY = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
EPILOGUE_STEPS = [{"op": "relu"}, {"op": "scale", "value": 0.5}, {"op": "mul", "channel": True},
                  {"op": "add"}, {"op": "gelu"}, {"op": "sub", "channel": True}, {"op": "leaky_relu", "value": 0.1}]


def assert_matches_torch(spec, config, trials=1):
    fam = catalog.family_of(spec)
    fam.validate(spec)
    result = check(spec, fam.render(spec, config), spec.dims, device="cpu", trials=trials)
    assert result.ok, f"{result.reason}\nspec={spec}\nconfig={config}"
    return result


def config(spec, **knobs):
    """A small config for the interpreter: the default's knobs with 16-wide tiles, then `knobs`."""
    cfg = {**CONV.default_config(spec, H200), "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2,
           "SPLIT_K": 1, "num_warps": 4, "num_stages": 2}
    return {**cfg, **knobs}


# -- random small convolutions ---------------------------------------------------------------
@st.composite
def conv_cases(draw):
    op = draw(st.sampled_from(OPS))
    r, transposed = rank(op), is_transposed(op)
    kernel = [draw(st.integers(1, 3)) for _ in range(r)]
    stride = [draw(st.integers(1, 3)) for _ in range(r)]
    dilation = [draw(st.integers(1, 2)) for _ in range(r)]
    if transposed:
        padding = [[p, p] for p in (draw(st.integers(0, (d * (k - 1)) // 2)) for k, d in zip(kernel, dilation))]
        output_padding = [draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation)]
    else:
        padding = [[draw(st.integers(0, 2)), draw(st.integers(0, 2))] for _ in range(r)]
        output_padding = None
    kind = draw(st.sampled_from(["plain", "grouped", "depthwise"]))
    groups = {"plain": 1, "grouped": 2, "depthwise": draw(st.integers(2, 3))}[kind]
    per_in = 1 if kind == "depthwise" else draw(st.integers(1, 5))
    per_out = draw(st.integers(1, 2)) if kind == "depthwise" else draw(st.integers(1, 6))
    size_cap = {1: 9, 2: 5, 3: 3}[r]
    spatial = []
    for k, s, (lo, hi), d, o in zip(kernel, stride, padding, dilation, output_padding or [0] * r):
        least = next(n for n in range(1, 99) if out_size(n, k, s, lo, hi, d, o, transposed) >= 1)
        spatial.append(draw(st.integers(least, max(least, size_cap))))
    epilogue = draw(st.lists(st.sampled_from(EPILOGUE_STEPS), max_size=2))
    dtype = draw(st.sampled_from(["float32", "float32", "float16", "bfloat16"]))
    spec = conv_spec(op, (draw(st.integers(1, 2)), groups * per_in, *spatial), groups * per_out, kernel,
                     stride=stride, padding=padding, dilation=dilation, groups=groups,
                     output_padding=output_padding or 0, bias=draw(st.booleans()), epilogue=epilogue, dtype=dtype)
    space = CONV.config_space(spec)
    cfg = {k: draw(st.sampled_from([v for v in values if not isinstance(v, int) or isinstance(v, bool)
                                    or v <= {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "SPLIT_K": 2,
                                             "GROUP_M": 4}.get(k, v)]))
           for k, values in space.items()}
    return spec, cfg


@PROPERTY
@given(conv_cases())
def test_conv_matches_torch(case):
    assert_matches_torch(*case)


# -- every op, every K walk, at a fixed awkward shape -------------------------------------------
SHAPES = {  # op: (x shape, out channels, kernel, params) with strides, padding, dilation and groups
    "conv1d": ((2, 4, 13), 6, 3, {"stride": 2, "padding": 1, "dilation": 2, "groups": 2}),
    "conv2d": ((1, 3, 7, 6), 5, (3, 2), {"stride": (2, 1), "padding": ((1, 0), (2, 1))}),
    "conv3d": ((1, 2, 3, 4, 5), 4, (2, 3, 1), {"stride": (1, 2, 1), "padding": 1, "dilation": (2, 1, 1)}),
    "conv_transpose1d": ((2, 4, 5), 6, 4, {"stride": 3, "padding": 1, "output_padding": 2, "groups": 2}),
    "conv_transpose2d": ((1, 3, 3, 4), 4, (3, 2), {"stride": (2, 3), "padding": (1, 0), "dilation": (2, 1),
                                                    "output_padding": (1, 0)}),
    "conv_transpose3d": ((1, 2, 2, 2, 2), 3, 3, {"stride": 2, "padding": 1, "dilation": 2}),
}


@pytest.mark.parametrize("algo", ["taps", "flat", "direct"])
@pytest.mark.parametrize("op", OPS)
def test_every_op_and_k_walk(op, algo):
    x, c_out, k, kw = SHAPES[op]
    dtype = {"taps": "float32", "flat": "float16", "direct": "bfloat16"}[algo]
    spec = conv_spec(op, x, c_out, k, bias=True, epilogue=[{"op": "mul", "channel": True}, {"op": "tanh"},
                                                           {"op": "residual"}], dtype=dtype, **kw)
    assert algo in CONV.config_space(spec)["ALGO"]
    assert_matches_torch(spec, config(spec, ALGO=algo, SPLIT_K=2 if op.endswith("2d") else 1,
                                      LAYOUT="channels_last" if op.endswith("3d") else "nchw"))


@pytest.mark.parametrize("precision", ["ieee", "tf32x3"])
def test_fp32_precisions_and_a_depthwise_conv(precision):
    spec = conv_spec("conv2d", (1, 4, 5, 4), 8, (3, 2), padding=1, groups=4, bias=True)
    assert "depthwise" not in CONV.describe(spec) and "4 groups" in CONV.describe(spec)
    dw = conv_spec("conv2d", (1, 3, 5, 6), 3, 3, padding=(1, 0), groups=3, epilogue=[{"op": "relu"}])
    assert "depthwise" in CONV.describe(dw) and CONV.default_config(dw, H200)["ALGO"] == "direct"
    for s in (spec, dw):
        assert_matches_torch(s, config(s, ALGO="taps", PRECISION=precision))


def test_tf32_is_a_knob_only_where_the_spec_allows_it():
    spec = conv_spec("conv2d", (1, 16, 5, 5), 16, 3)
    assert CONV.config_space(spec)["PRECISION"] == ["ieee", "tf32x3"]
    allowed = conv_spec("conv2d", (1, 16, 5, 5), 16, 3, allow_tf32=True)
    assert CONV.config_space(allowed)["PRECISION"] == ["ieee", "tf32x3", "tf32"]
    assert "PRECISION" not in CONV.config_space(conv_spec("conv2d", (1, 16, 5, 5), 16, 3, dtype="float16"))
    # allowing TF32 widens the error scale by the TF32 rounding (2**-11 per operand, vs 1e-4)
    assert "* 16.0" in CONV.reference_source(allowed) and "* 16.0" not in CONV.reference_source(spec)
    assert_matches_torch(allowed, config(allowed, ALGO="taps", PRECISION="tf32"))


def test_check_dims_are_small_consistent_and_run():
    spec = conv_spec("conv_transpose2d", (16, 16, 128, 255), 8, (3, 5), stride=(2, 3), padding=(1, 2),
                     dilation=(2, 1), groups=2, output_padding=(1, 0), bias=True, dtype="float16")
    cfg = config(spec, ALGO="flat", BLOCK_M=16, BLOCK_K=32, GROUP_M=1)
    dims = CONV.check_dims(spec, cfg)
    small = spec.with_dims(**dims)
    CONV.validate(small)   # output dims follow the formula, groups still divide the channels
    assert dims["N"] == 2 and dims["C_in"] % 2 == 0 and dims["C_out"] % 2 == 0
    assert dims["H"] < 128 and dims["W"] < 255 and (255 - dims["W"]) % 3 == 0   # same remainder mod stride
    assert_matches_torch(small, cfg)
    tiny = conv_spec("conv1d", (1, 2, 5), 3, 3)
    assert CONV.check_dims(tiny, CONV.default_config(tiny, H200)) == tiny.dims   # small stays as it is


@pytest.mark.parametrize("split", [1, 2])
def test_64_bit_offsets_compute_the_same(split):
    """The INDEX_64 path (tensors past 2**31 elements) forced on at a small size."""
    spec = conv_spec("conv_transpose2d", (2, 4, 3, 4), 6, 3, stride=2, padding=1, groups=2, bias=True,
                     epilogue=[{"op": "mul", "channel": True}])
    source = CONV.render(spec, config(spec, ALGO="taps", SPLIT_K=split))
    forced = source.replace("INDEX_64 = max(", "INDEX_64 = True or max(")
    assert forced != source and check(spec, forced, device="cpu", trials=1).ok


# -- broken sources must be rejected ----------------------------------------------------------------
def test_check_rejects_a_wrong_stride():
    spec = conv_spec("conv2d", (1, 4, 9, 9), 4, 3, stride=2, padding=1)
    source = CONV.render(spec, config(spec, ALGO="taps"))
    broken = source.replace("i0_w = q_w * 2 - 1", "i0_w = q_w * 1 - 1")
    assert broken != source
    assert check(spec, source, device="cpu", trials=1).ok
    assert not check(spec, broken, device="cpu", trials=1).ok


def test_check_rejects_a_transposed_conv_that_visits_the_wrong_phase_taps():
    spec = conv_spec("conv_transpose1d", (1, 4, 6), 4, 3, stride=2, padding=1)
    source = CONV.render(spec, config(spec, ALGO="taps"))
    broken = source.replace("(r_l + 1 - j * 1) % 2 == 0", "(r_l + 1 - j * 1) % 2 == 1")
    assert broken != source and check(spec, source, device="cpu", trials=1).ok
    assert not check(spec, broken, device="cpu", trials=1).ok


def test_check_rejects_a_channel_operand_read_at_the_wrong_channel():
    spec = conv_spec("conv2d", (1, 4, 5, 5), 4, 3, epilogue=[{"op": "mul", "channel": True}])
    source = CONV.render(spec, config(spec, ALGO="taps"))
    broken = source.replace("mul0_ptr + co[None, :]", "mul0_ptr + (co * 0)[None, :]")   # channel 0 for all
    assert broken != source and check(spec, source, device="cpu", trials=1).ok
    assert not check(spec, broken, device="cpu", trials=1).ok


# -- sm_90 resources of the defaults -----------------------------------------------------------------
COMPILE_SPECS = {  # KernelBench level-1 shapes
    "conv1d": conv_spec("conv1d", (32, 64, 131072), 128, 3),
    "conv2d": conv_spec("conv2d", (8, 64, 512, 1024), 128, 3),
    "conv2d_depthwise": conv_spec("conv2d", (32, 128, 128, 256), 128, (3, 7), groups=128),
    "conv3d": conv_spec("conv3d", (16, 3, 256, 256, 10), 64, (3, 3, 1)),
    "conv_transpose1d": conv_spec("conv_transpose1d", (16, 32, 131072), 64, 3, stride=2, padding=1, dilation=2),
    "conv_transpose2d": conv_spec("conv_transpose2d", (16, 32, 128, 256), 64, (3, 5), stride=(2, 3),
                                  padding=(1, 2), dilation=(2, 1), groups=4),
    "conv_transpose3d": conv_spec("conv_transpose3d", (16, 32, 16, 32, 32), 64, 3, stride=2, padding=1,
                                  dilation=2, bias=True, epilogue=[{"op": "relu"}]),
}

def test_default_configs_compile_for_sm90_without_spills_and_within_shared_memory():
    specs = {}
    for name, spec in COMPILE_SPECS.items():
        specs[f"{name} float32"] = spec.to_dict()
        specs[f"{name} float16"] = {**spec.to_dict(), "dtype": "float16"}
    specs["conv2d float32 index64"] = COMPILE_SPECS["conv2d"].to_dict()
    specs["conv_transpose3d bfloat16 index64"] = {**COMPILE_SPECS["conv_transpose3d"].to_dict(), "dtype": "bfloat16"}
    reports = compile_defaults(specs)
    for name, report in reports.items():
        (kernel,) = [k for k in report["kernels"] if k["name"] == "conv_kernel"]
        assert kernel["error"] is None, f"{name}: {kernel['error']}"
        assert report["violations"] == [], f"{name}: {report['violations']}"
        assert kernel["spill_bytes"] == 0 and 0 <= kernel["shared_bytes"] <= H200.smem_per_block, name
        assert kernel["regs"] <= 255, name


# -- the plain-data parts -----------------------------------------------------------------------------
@pytest.mark.parametrize("op, change, match", [
    ("conv2d", {"dims": {"OH": 7}}, "output dims"),
    ("conv2d", {"params": {"groups": 3}}, "groups"),
    ("conv_transpose2d", {"params": {"padding": [[1, 0], [1, 1]]}}, "symmetric"),
    ("conv_transpose2d", {"params": {"output_padding": [2, 0]}}, "output_padding"),
    ("conv2d", {"params": {"output_padding": [0, 0]}}, "transposed convs only"),
    ("conv2d", {"params": {"epilogue": [{"op": "add", "every": 2, "period": 3}]}}, "periodic"),
    ("conv2d", {"params": {"epilogue": [{"op": "mul", "channel": True, "scalar": True}]}}, "not both"),
    ("conv2d", {"params": {"stride": [0, 1]}}, "stride"),
    ("conv2d", {"params": {"allow_tf32": True}, "dtype": "float16"}, "allow_tf32"),
    ("conv2d", {"op": "conv4d"}, "no op"),
])
def test_validate_rejects_bad_specs(op, change, match):
    d = conv_spec(op, (2, 4, 8, 8), 6, 3, stride=(2, 1), padding=1).to_dict()
    d["dims"].update(change.get("dims", {}))
    d["params"].update(change.get("params", {}))
    d["op"], d["dtype"] = change.get("op", d["op"]), change.get("dtype", d["dtype"])
    with pytest.raises(ValueError, match=match):
        CONV.validate(KernelSpec.from_dict(d))


def test_spec_shapes_and_words():
    spec = conv_spec("conv_transpose2d", (4, 8, 10, 12), 6, (3, 5), stride=2, padding=(1, 2), groups=2,
                     output_padding=1, bias=True, epilogue=[{"op": "residual"}, {"op": "mul", "channel": True}])
    assert spec.dims == {"N": 4, "C_in": 8, "C_out": 6, "H": 10, "W": 12, "OH": 20, "OW": 24}
    shapes = [(a.name, a.concrete_shape(spec.dims)) for a in CONV.inputs(spec)]
    assert shapes == [("x", (4, 8, 10, 12)), ("w", (8, 3, 3, 5)), ("bias0", (6,)), ("residual1", (4, 6, 20, 24)),
                      ("mul2", (6,))]
    assert CONV.output(spec).concrete_shape(spec.dims) == (4, 6, 20, 24)
    words = CONV.describe(spec)
    assert "conv_transpose2d" in words and "stride 2x2" in words and "2 groups" in words and "bias" in words
    assert conv_spec("conv2d", (1, 3, 9, 9), 4, 3, padding=((1, 0), (2, 2))).params["padding"] == [[1, 0], [2, 2]]
    with pytest.raises(ValueError, match="2 value"):
        conv_spec("conv2d", (1, 3, 9, 9), 4, (3, 3, 3))


def test_work_counts_macs_once_and_minimum_bytes():
    spec = conv_spec("conv2d", (2, 4, 8, 8), 6, 3, stride=2, padding=1, groups=2, bias=True, dtype="float16")
    flops, nbytes = CONV.work(spec)
    out = 2 * 6 * 4 * 4
    assert flops == 2 * out * (4 // 2) * 9 + out
    assert nbytes == 2 * (2 * 4 * 8 * 8 + 6 * 2 * 9 + out + 6)
    # a transposed conv does the same multiply-adds as the conv it is the gradient of
    t = conv_spec("conv_transpose2d", (2, 6, 4, 4), 4, 3, stride=2, padding=1, output_padding=1, groups=2)
    assert t.dims["OH"] == 8 and CONV.work(t)[0] == 2 * (2 * 6 * 4 * 4) * 2 * 9


@pytest.mark.parametrize("spec", list(COMPILE_SPECS.values()) + [
    conv_spec("conv2d", (1, 3, 224, 224), 64, 7, stride=2, padding=3, dtype="bfloat16"),
    conv_spec("conv2d", (32, 256, 14, 14), 256, 3, padding=1, dtype="float16", allow_tf32=False),
])
def test_default_config_is_in_the_config_space(spec):
    space, cfg = CONV.config_space(spec), CONV.default_config(spec, H200)
    assert set(cfg) == set(space)
    for knob, values in space.items():
        if all(isinstance(v, int) for v in values):
            assert values == sorted(values)
        assert cfg[knob] in values


def test_the_catalog_serves_convs():
    assert catalog.supported_ops()["conv"] == OPS
    spec = conv_spec("conv2d", (1, 3, 8, 8), 4, 3)
    assert catalog.family_of(spec) is CONV and KernelSpec.from_dict(spec.to_dict()) == spec


def test_the_standalone_file_knows_every_size_a_shape_names():
    from mtmc.kernels.codegen import named_sizes
    spec = conv_spec("conv2d", (2, 8, 9, 9), 6, 3, groups=2)
    assert named_sizes(CONV, spec, spec.dims) == {**spec.dims, "C_in/G": 4}


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ["taps", "flat"])
def test_transposed_3d_with_stride_dividing_dilation_is_right_on_the_gpu(algo):
    """KernelBench level-1 task 77 (conv_transpose3d, stride 2, dilation 2): right in the
    interpreter, wrong on the H200 in every config until the phase's taps were computed by plain
    arithmetic (three tap searches in one 3-D kernel)."""
    import torch
    from mtmc.tools.loader import load_source
    spec = conv_spec("conv_transpose3d", (2, 8, 5, 6, 7), 16, 3, stride=2, padding=1, dilation=2)
    cfg = {**CONV.default_config(spec, PROFILES["h200"]), "ALGO": algo}
    module = load_source(CONV.render(spec, cfg), "c77")
    x, w = torch.randn(2, 8, 5, 6, 7, device="cuda"), torch.randn(8, 16, 3, 3, 3, device="cuda")
    truth = torch.nn.functional.conv_transpose3d(x.double(), w.double(), stride=2, padding=1, dilation=2)
    out = torch.full(truth.shape, float("nan"), device="cuda")
    module.launch(x, w, out=out)
    assert torch.allclose(out.double(), truth, rtol=1e-4, atol=1e-3)


def test_split_k_partials_are_indexed_in_64_bits_when_they_pass_2_31():
    """On the H200 (2026-12-04) an fp32 conv2d [16, 16, 256, 512] -> 128 channels with SPLIT_K=16
    read out of bounds: the output has 2.7e8 elements, its 16 partials 4.2e9, and `split * numel`
    was an int32 product even on the INDEX_64 path (numel < 2**31 on its own)."""
    spec = conv_spec("conv2d", (16, 16, 256, 512), 128, 3)
    source = CONV.render(spec, config(spec, ALGO="taps", SPLIT_K=16))
    assert "split.to(tl.int64) * numel if INDEX_64" in source
    assert "numel.to(tl.int64) * s if INDEX_64" in source
    # and the launch asks for that path at this size
    numel = 16 * 128 * 254 * 510
    assert 16 * numel >= 2**31 > numel


@pytest.mark.gpu
def test_split_k_conv_past_2_31_partials_is_right_on_the_gpu():
    import torch
    from mtmc.tools.loader import load_source
    spec = conv_spec("conv2d", (16, 16, 256, 512), 128, 3)
    module = load_source(CONV.render(spec, config(spec, ALGO="taps", LAYOUT="channels_last", SPLIT_K=16,
                                                  BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)), "c_split")
    x, w = torch.randn(16, 16, 256, 512, device="cuda"), torch.randn(128, 16, 3, 3, device="cuda")
    # cuDNN in IEEE fp32 as the reference: a float64 conv this size ran past 3 minutes on the H200
    torch.backends.cudnn.allow_tf32 = False
    truth = torch.nn.functional.conv2d(x, w)
    out = torch.full(truth.shape, float("nan"), device="cuda")
    module.launch(x, w, out=out)
    torch.cuda.synchronize()
    assert torch.allclose(out, truth, rtol=1e-4, atol=1e-3)
