"""bench.conv's own logic on the CPU (its numbers come from the GPU): every task is a valid
spec at full and quick size, every config it would time renders, and the table reads its rows."""
from bench.conv import TASKS, VARIANTS, quick_shape, spec_of, table, variants_of
from mtmc.kernels.families.conv import FAMILY
from mtmc.tools.hardware import PROFILES


def test_every_task_and_variant_renders_at_full_and_quick_size():
    for name in TASKS:
        for dtype in ("float32", "bfloat16"):
            for quick in (False, True):
                spec = spec_of(name, dtype, quick)
                FAMILY.validate(spec)
                base = FAMILY.default_config(spec, PROFILES["h200"])
                for change in [{}, *variants_of(spec, base)]:
                    assert "def launch(" in FAMILY.render(spec, {**base, **change})
    fp32 = spec_of("55_conv2d_asym_input", "float32", False)
    assert {"PRECISION": "ieee"} in variants_of(fp32, FAMILY.default_config(fp32, PROFILES["h200"]))
    fp16 = spec_of("55_conv2d_asym_input", "float16", False)
    assert all("PRECISION" not in v for v in variants_of(fp16, FAMILY.default_config(fp16, PROFILES["h200"])))
    assert len(VARIANTS) > 5


def test_quick_sizes_are_smaller():
    assert quick_shape((8, 64, 512, 1024)) == (4, 64, 512, 256)
    assert quick_shape((1, 3, 5)) == (1, 3, 1)


def test_table_shows_measured_and_failed_rows():
    ok = {"task": "55", "dtype": "float32", "change": "default", "ours_ms": 1.5, "eager_ms": 1.2,
          "eager_strict_ms": 2.0, "compiled_ms": 1.1, "vs_eager": 0.8, "vs_compiled": 0.73, "tflops": 40.0,
          "ours_err": 2e-7, "cudnn_err": 9e-4, "cudnn_strict_err": 1e-7, "ours_tol": 0.01}
    bad = {"task": "55", "dtype": "float32", "change": {"BLOCK_K": 64}, "error": "OutOfResources: shared memory"}
    text = table([ok, bad])
    assert "| 55 | float32 | default | 1.500 | 1.200 | 2.000 | 1.100 | 0.80 | 0.73 | 40.0 | 2.0e-07 | 9.0e-04 |" in text
    assert "| 55 | float32 | BLOCK_K=64 | - |" in text and text.rstrip().endswith("| OutOfResources: shared memory |")


def test_errors_measures_ours_and_the_reference_against_float64():
    from bench.conv import errors
    from mtmc.kernels.families.conv import conv_spec
    spec = conv_spec("conv2d", (1, 4, 5, 5), 4, 3, padding=1, bias=True)
    cfg = {**FAMILY.default_config(spec, PROFILES["h200"]), "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}
    e = errors(spec, FAMILY.render(spec, cfg), device="cpu")
    assert e["ours_ok"] and e["ours_tol"] < 1 and 0 <= e["ours_err"] < 1e-5
    assert 0 <= e["cudnn_err"] < 1e-5 and 0 <= e["cudnn_strict_err"] < 1e-5   # the CPU's conv has no TF32
    broken = FAMILY.render(spec, cfg).replace("x = (x + bias0)", "x = x")
    assert not errors(spec, broken, device="cpu")["ours_ok"]
