"""Conv padding modes (reflect, replicate, circular) served by the conv kernel's own gather:
every algorithm against PyTorch in the interpreter, refusals in words, the default configs compile
for sm_90, and nn.Conv*d(padding_mode=...) modules end to end."""
from __future__ import annotations

from pathlib import Path

import pytest

from mtmc.kernels.families import conv
from mtmc.kernels.families.conv import conv_spec
from mtmc.kernels.spec import KernelSpec
from mtmc.module.capture import capture
from mtmc.module.fusion import partition
from mtmc.tools.hardware import PROFILES
from kernel_helpers import compile_defaults
from tests.test_family_rows import assert_correct
from tests.test_module_conv import assert_model_new_matches

H200 = PROFILES["h200"]
SHAPES = {
    "conv2d asymmetric per dim": ("conv2d", (2, 4, 9, 10), 6, 3, {"padding": (1, 2)}),
    "conv1d stride dilation": ("conv1d", (2, 4, 11), 4, 3, {"padding": 2, "stride": 2, "dilation": 2}),
    "conv2d depthwise": ("conv2d", (2, 4, 7, 8), 4, 3, {"padding": 1, "groups": 4}),
    "conv3d one dim unpadded": ("conv3d", (1, 2, 5, 6, 5), 3, 3, {"padding": (1, 1, 0)}),
}


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_padding_modes_match_pytorch(mode, name):
    op, x, co, k, kw = SHAPES[name]
    spec = conv_spec(op, x, co, k, padding_mode=mode, **kw)
    conv.FAMILY.validate(spec)
    # every K walk on the conv2d (each builds its offsets its own way), the default elsewhere
    algos = conv.FAMILY.config_space(spec)["ALGO"] if name.startswith("conv2d asym") else [None]
    for algo in algos:
        cfg = conv.FAMILY.default_config(spec, H200)
        assert_correct(conv.FAMILY, spec, {**cfg, "ALGO": algo or cfg["ALGO"]})


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_reflect_with_a_tail(dtype):
    spec = conv_spec("conv2d", (2, 8, 6, 7), 8, 3, padding=1, padding_mode="reflect", dtype=dtype,
                     bias=True, epilogue=[{"op": "relu"}])
    assert_correct(conv.FAMILY, spec, conv.FAMILY.default_config(spec, H200))


@pytest.mark.parametrize("change, match", [
    ({"padding_mode": "mirror"}, "padding_mode must be one of"),
    ({"padding_mode": "reflect", "padding": [[6, 6], [1, 1]]}, "larger input dim H"),
])
def test_refusals_in_words(change, match):
    spec = conv_spec("conv2d", (1, 2, 6, 6), 2, 3, padding=1)
    params = {**spec.params, **change}
    d = dict(spec.dims)
    if "padding" in change:
        d.update(conv.output_dims("conv2d", d, params))
    with pytest.raises(ValueError, match=match):
        conv.FAMILY.validate(KernelSpec("conv", "conv2d", d, "float32", params))


def test_transposed_convs_pad_with_zeros_only():
    spec = conv_spec("conv_transpose2d", (1, 2, 6, 6), 2, 3, padding=1, padding_mode="circular")
    with pytest.raises(ValueError, match="zeros only"):
        conv.FAMILY.validate(spec)


def test_default_configs_compile_for_sm90():
    specs = {f"{mode} {dtype}": {**conv_spec("conv2d", (8, 64, 256, 256), 64, 3, padding=1,
                                             padding_mode=mode).to_dict(), "dtype": dtype}
             for mode in ("reflect", "replicate", "circular") for dtype in ("float32", "float16")}
    specs["conv1d circular"] = conv_spec("conv1d", (16, 32, 65536), 64, 5, padding=2, padding_mode="circular").to_dict()
    for name, report in compile_defaults(specs).items():
        (kernel,) = [k for k in report["kernels"] if k["name"] == "conv_kernel"]
        assert kernel["error"] is None, f"{name}: {kernel['error']}"
        assert report["violations"] == [] and kernel["spill_bytes"] == 0, name


def test_padding_mode_modules_end_to_end(tmp_path):
    path = Path(__file__).parent / "modules" / "conv_padding_modes.py"
    cap = capture(str(path))
    part = partition(cap)
    assert [g.spec["params"].get("padding_mode") for g in part.groups] == ["reflect", "replicate", "circular"]
    assert part.torch_ops == []
    assert_model_new_matches(tmp_path, path.read_text(), cap, part)
