"""The offline roofline estimate (kernels.estimate): labelled, bounded below by the ideal, and
monotone in the directions an expert would defend."""
import itertools
import math
import random

import pytest

from mtmc.kernels.catalog import family_of
from mtmc.kernels.spec import KernelSpec
from mtmc.kernels.estimate import LABEL, estimate_time, roofline
from mtmc.tools.hardware import PROFILES

H200 = PROFILES["h200"]
MM = KernelSpec("matmul", "matmul", {"M": 8192, "N": 8192, "K": 8192}, "float16")
TALL_K = KernelSpec("matmul", "matmul", {"M": 256, "N": 256, "K": 65536}, "float16")
EW = KernelSpec("elementwise", "chain", {"M": 8192, "N": 8192}, "float16", {"chain": [{"op": "gelu"}]})
BASE_MM = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1, "PERSISTENT": False,
           "num_warps": 4, "num_stages": 3}


def ms(spec, resources=None, **changes):
    base = BASE_MM if spec.family == "matmul" else {"BLOCK": 1024, "num_warps": 4, "PERSISTENT": False}
    est = estimate_time(spec, {**base, **changes}, H200, resources)
    assert est["feasible"], est["reason"]
    return est["ms"]


def test_roofline_bounds():
    mm = roofline(MM, H200)
    flops, nbytes = family_of(MM).work(MM)
    assert mm["bound"] == "compute" and mm["tensor_core"] and mm["peak_tflops"] == 790.0
    assert mm["intensity"] == pytest.approx(flops / nbytes)
    assert mm["ideal_ms"] == pytest.approx(flops / 790e12 * 1e3)
    ew = roofline(EW, H200)
    assert ew["bound"] == "memory" and not ew["tensor_core"]
    assert ew["ideal_ms"] == pytest.approx(family_of(EW).work(EW)[1] / 4300e9 * 1e3)
    assert mm["ridge"] == pytest.approx(790e12 / 4300e9)
    fp32 = roofline(KernelSpec("matmul", "matmul", MM.dims, "float32"), H200)
    assert fp32["peak_tflops"] == H200.fp32_tflops and not fp32["tensor_core"]   # IEEE fp32, no TF32


def test_estimate_is_labelled_and_never_beats_the_roofline():
    space = family_of(MM).config_space(MM)
    rng = random.Random(0)
    keys = list(space)
    for _ in range(200):
        config = {k: rng.choice(space[k]) for k in keys}
        est = estimate_time(MM, config, H200)
        assert est["measured"] is False and est["label"] == LABEL
        if est["feasible"]:
            assert est["ms"] >= est["ideal_ms"] and 0 < est["efficiency"] <= 1
        else:
            assert est["ms"] is None and est["reason"]


def test_matmul_tiles_grouping_and_pipelining():
    assert ms(MM) < ms(MM, BLOCK_M=64, BLOCK_N=64) < ms(MM, BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)
    assert ms(MM, GROUP_M=8) < ms(MM, GROUP_M=1)          # squarer waves re-read less from DRAM
    assert ms(MM, num_stages=3) < ms(MM, num_stages=2) < ms(MM, num_stages=1)
    assert ms(MM, PERSISTENT=True) < ms(MM)
    assert ms(MM, BLOCK_K=64) < ms(MM, BLOCK_K=16)


def test_split_k_helps_only_when_tiles_cannot_fill_the_gpu():
    assert ms(TALL_K, SPLIT_K=16) < ms(TALL_K, SPLIT_K=4) < ms(TALL_K, SPLIT_K=1)
    assert ms(MM, SPLIT_K=4) > ms(MM, SPLIT_K=1)           # partial sums cost, waves were full


def test_wave_quantization():
    # 132 tiles fill the 132 SMs exactly; one more tile costs a whole extra wave of math.
    full = KernelSpec("matmul", "matmul", {"M": 128 * 12, "N": 128 * 11, "K": 16384}, "float16")
    one_more = full.with_dims(M=128 * 12 + 1)
    full_est = estimate_time(full, BASE_MM, H200)
    more_est = estimate_time(one_more, BASE_MM, H200)
    assert full_est["factors"]["wave_efficiency"] == 1.0
    assert more_est["factors"]["wave_efficiency"] < 0.6
    assert more_est["ms"] > 1.5 * full_est["ms"]


def test_elementwise_is_near_bandwidth_and_small_blocks_cost():
    good = estimate_time(EW, {"BLOCK": 1024, "num_warps": 4}, H200)
    assert good["bound"] == "memory" and good["efficiency"] > 0.8
    assert ms(EW, BLOCK=1024) < ms(EW, BLOCK=256)
    tiny = KernelSpec("elementwise", "chain", {"M": 1, "N": 256}, "float16", {"chain": [{"op": "relu"}]})
    assert ms(tiny, BLOCK=256) >= 0.003                     # a launch costs ~3 us whatever it does


def _report(regs, shared=0, spill=0, warps=4, violations=()):
    kernel = {"name": "k", "num_warps": warps, "num_stages": 3, "regs": regs, "shared_bytes": shared,
              "spill_bytes": spill, "launches": 1, "error": None}
    return {"kernels": [kernel], "violations": [dict(v) for v in violations]}


def test_compile_report_drives_occupancy_spills_and_feasibility():
    # Few bytes per program: bandwidth needs many resident programs, which registers limit.
    cfg = {"BLOCK": 256, "num_warps": 4}
    lean = estimate_time(EW, cfg, H200, _report(regs=32))
    fat = estimate_time(EW, cfg, H200, _report(regs=255))
    assert lean["resources_from"] == "compile report"
    assert lean["occupancy"] > fat["occupancy"]
    assert fat["factors"]["bandwidth_efficiency"] < lean["factors"]["bandwidth_efficiency"]
    assert fat["ms"] > lean["ms"]
    assert ms(MM, _report(regs=200, shared=99328, spill=512)) > ms(MM, _report(regs=200, shared=99328))
    over = estimate_time(MM, BASE_MM, H200, _report(regs=128, shared=300_000, violations=[
        {"kind": "smem_overflow", "detail": "needs 300000 B of shared memory per block"}]))
    assert over["feasible"] is False and over["ms"] is None and "shared memory" in over["reason"]


def test_config_alone_flags_a_shared_memory_overflow():
    est = estimate_time(MM, {**BASE_MM, "BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "num_stages": 5}, H200)
    assert est["feasible"] is False and "shared memory" in est["reason"]


@pytest.mark.parametrize("spec", [
    KernelSpec("reduction", "sum", {"M": 4096, "N": 8192}, "float32"),
    KernelSpec("softmax", "softmax", {"M": 4096, "N": 8192}, "float16"),
    KernelSpec("norm", "layernorm", {"M": 4096, "N": 4096}, "bfloat16"),
    EW, MM,
    KernelSpec("matmul", "bmm", {"B": 8, "M": 1024, "N": 1024, "K": 1024}, "bfloat16"),
])
def test_every_family_default_config_is_feasible(spec):
    fam = family_of(spec)
    est = estimate_time(spec, fam.default_config(spec, H200), H200)
    assert est["feasible"], est["reason"]
    assert math.isfinite(est["ms"]) and est["ms"] >= est["ideal_ms"]
    assert est["efficiency"] > 0.3, est          # a sensible default is not far off the roofline


def test_row_ops_whole_rows_beat_a_spilling_giant_tile():
    spec = KernelSpec("softmax", "softmax", {"M": 4096, "N": 65536}, "float32")
    looped = estimate_time(spec, {"BLOCK_N": 4096, "num_warps": 8, "num_stages": 2, "ROWS_PER_PROG": 1}, H200)
    giant = estimate_time(spec, {"BLOCK_N": 65536, "num_warps": 16, "num_stages": 1, "ROWS_PER_PROG": 1}, H200)
    assert giant["factors"]["spill_factor"] > 1 and looped["ms"] < giant["ms"]


def test_monotone_in_num_stages_over_a_grid():
    for bm, bn, bk in itertools.product([64, 128], [64, 128], [32, 64]):
        times = [ms(MM, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_stages=s) for s in (1, 2, 3)]
        assert times[0] > times[1] > times[2]
