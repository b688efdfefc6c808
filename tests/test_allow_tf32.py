"""TF32 only where the user allows it (`mtmc optimize --allow-tf32`): fp32 conv and matmul groups
then default to one TF32 product per product, their own checks and the module check widen the fp32
tolerance to TF32's rounding, and nothing else changes (fp16 groups, other families, the default)."""
from __future__ import annotations

import pytest
import torch

from kernel_helpers import compile_configs
from mtmc.agents.context import Context
from mtmc.agents.module_flow import tf32_allowed
from mtmc.commands.cli import build_parser
from mtmc.kernels.families.conv import FAMILY as CONV
from mtmc.kernels.families.conv import conv_spec
from mtmc.kernels.families.matmul import FAMILY as MATMUL
from mtmc.kernels.spec import TF32_ERROR_SCALE, KernelSpec
from mtmc.kernels.task import check
from mtmc.tools.guard import numeric
from mtmc.tools.hardware import PROFILES

H200 = PROFILES["h200"]


def _matmul(allow=None, dtype="float32"):
    params = {"b_layout": "nk", "epilogue": [{"op": "bias"}, {"op": "relu"}]}
    if allow is not None:
        params["allow_tf32"] = allow
    return KernelSpec("matmul", "matmul", {"M": 40, "N": 24, "K": 72}, dtype, params)


def test_matmul_tf32_is_a_knob_and_the_default_only_where_allowed():
    plain, allowed = _matmul(), _matmul(True)
    assert MATMUL.config_space(plain)["PRECISION"] == ["ieee", "tf32x3"]
    assert MATMUL.config_space(allowed)["PRECISION"] == ["ieee", "tf32x3", "tf32"]
    assert MATMUL.default_config(plain, H200)["PRECISION"] == "tf32x3"
    assert MATMUL.default_config(allowed, H200)["PRECISION"] == "tf32"
    assert "TF32 products allowed" in MATMUL.describe(allowed) and "TF32" not in MATMUL.describe(plain)
    # the error scale widens by TF32's rounding, the reference is the same
    assert f"* {TF32_ERROR_SCALE}" in MATMUL.reference_source(allowed)
    assert f"* {TF32_ERROR_SCALE}" not in MATMUL.reference_source(plain)
    with pytest.raises(ValueError, match="allow_tf32"):
        MATMUL.validate(_matmul(True, "float16"))


def test_conv_defaults_to_tf32_only_where_allowed():
    plain = conv_spec("conv2d", (2, 16, 9, 9), 16, 3)
    allowed = conv_spec("conv2d", (2, 16, 9, 9), 16, 3, allow_tf32=True)
    assert CONV.default_config(plain, H200)["PRECISION"] == "tf32x3"
    assert CONV.default_config(allowed, H200)["PRECISION"] == "tf32"


def test_an_allowed_tf32_matmul_runs_and_matches_torch_in_the_interpreter():
    spec = _matmul(True)
    cfg = {**MATMUL.default_config(spec, H200), "BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "SPLIT_K": 1}
    source = MATMUL.render(spec, cfg)
    assert 'input_precision="tf32"' in source
    result = check(spec, source, spec.dims, device="cpu", trials=1)
    assert result.ok, result.reason


def test_the_default_tf32_configs_compile_for_sm90():
    reports = compile_configs({"matmul": (_matmul(True).to_dict(), None),
                               "conv": (conv_spec("conv2d", (8, 64, 28, 28), 64, 3, padding=1,
                                                  allow_tf32=True).to_dict(), None)})
    for name, report in reports.items():
        assert report["kernels"] and not [k for k in report["kernels"] if k["error"]], name
        assert report["violations"] == [], name


def test_the_module_flow_allows_tf32_on_fp32_convs_and_matmuls_only():
    fp32 = _matmul().to_dict()
    assert tf32_allowed(fp32, False) == fp32                       # the default: untouched
    assert tf32_allowed(fp32, True)["params"]["allow_tf32"] is True
    assert "allow_tf32" not in fp32["params"]                     # the group's own spec is not changed
    fp16 = _matmul(dtype="float16").to_dict()
    assert tf32_allowed(fp16, True) == fp16
    norm = KernelSpec("norm", "layernorm", {"M": 8, "N": 32}, "float32", {}).to_dict()
    assert tf32_allowed(norm, True) == norm


def test_cli_flag_reaches_the_context():
    args = build_parser().parse_args(["optimize", "m.py", "--out", "n.py", "--allow-tf32"])
    assert args.allow_tf32 is True
    assert Context().allow_tf32 is False


def _tf32(t):
    """t with its fp32 mantissa rounded to TF32's 10 bits (round to nearest), as a tensor core reads it."""
    bits = t.to(torch.float32).view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def test_module_check_tolerance_widens_only_when_tf32_is_allowed():
    """A matmul computed from TF32-rounded inputs (what one TF32 product per product gives) fails
    the fp32 bound and passes the widened one; the precision check does not call it half precision
    then; a wrong result still fails."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(512, 1024, generator=g), torch.randn(1024, 384, generator=g)
    ref = a.double() @ b.double()
    eager = a @ b
    tf32 = (_tf32(a).double() @ _tf32(b).double()).float()
    assert not numeric.compare(tf32, ref, eager)["ok"]
    assert numeric.compare(tf32, ref, eager, numeric.TF32_MODULE_SCALE)["ok"]
    assert not numeric.compare(tf32 * 1.02, ref, eager, numeric.TF32_MODULE_SCALE)["ok"]
    assert not numeric.compare(torch.zeros_like(tf32), ref, eager, numeric.TF32_MODULE_SCALE)["ok"]
    assert numeric.precision_loss(tf32, ref, eager, allowed=True)["reduced"] is False


@pytest.mark.slow
@pytest.mark.parametrize("name", ["linear_bias_relu.py", "conv_bias_act.py"])
def test_optimize_with_tf32_allowed_writes_tf32_kernels_that_pass_the_module_check(name, tmp_path):
    """The whole flow in the interpreter: the conv or matmul group's kernel multiplies in TF32 and
    the module check (its tolerance widened) passes; without the flag the same group keeps fp32
    accuracy."""
    from pathlib import Path

    from mtmc.agents.module_flow import optimize_module
    module = Path(__file__).parent / "modules" / name
    out = tmp_path / "new.py"
    summary = optimize_module(str(module), Context(target="h200", max_steps=0, allow_tf32=True), str(out))
    assert summary["status"] == "done" and summary["check"]["status"] == "passed", summary.get("check")
    assert 'input_precision="tf32"' in out.read_text()
    assert "TF32 products allowed (--allow-tf32)" in summary["report"]


def test_the_chat_setting_reaches_the_modules_context_and_the_status_says_it(monkeypatch):
    from mtmc.ui import chat
    from mtmc.ui.settings import Settings, status_markdown
    assert chat._context(Settings(allow_tf32=True)).allow_tf32 is True
    assert chat._context(Settings()).allow_tf32 is False
    assert "**TF32 allowed**" in status_markdown(Settings(allow_tf32=True), {})
    assert "TF32 off" in status_markdown(Settings(), {})
    monkeypatch.setenv("MTMC_ALLOW_TF32", "1")
    assert Settings.from_env().allow_tf32 is True
