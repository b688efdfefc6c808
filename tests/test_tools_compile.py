"""Compiling candidates for an absent H200 and judging their resources (tools.target_compile)."""
import math
import os

import pytest

from mtmc.kernels.spec import KernelSpec
from mtmc.kernels.task import compile_resources
from mtmc.tools.hardware import PROFILES
from mtmc.tools.loader import load_source
from mtmc.tools.target_compile import blocks_per_sm, compiled_mode, occupancy, parse_resource_usage, specialize

H200 = PROFILES["h200"]
# Hand-written candidates for an elementwise spec: launch(x, out) over x [M, N].
EW = KernelSpec("elementwise", "chain", {"M": 64, "N": 256}, "float32", {"chain": [{"op": "relu"}]})
MM = KernelSpec("matmul", "matmul", {"M": 256, "N": 256, "K": 256}, "float16")

HEADER = "import triton\nimport triton.language as tl\n\n"

ADD_ONE = HEADER + '''
@triton.jit
def add_one(x_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)


def launch(x, out):
    n = x.numel()
    add_one[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK, num_warps=4)
    for _ in range(REPEAT - 1):
        add_one[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n, BLOCK=BLOCK, num_warps=4)
'''

# Every thread keeps BLOCK / 32 fp32 values alive across the loop: 256 with one warp.
SPILLER = HEADER + '''
@triton.jit
def spiller(x_ptr, out_ptr, steps, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(0, steps):
        acc = acc * 1.0001 + tl.load(x_ptr + i * BLOCK + offs)
    tl.store(out_ptr + offs, acc)


def launch(x, out):
    spiller[(1,)](x, out, x.numel() // BLOCK, BLOCK=BLOCK, num_warps=WARPS)
'''

# A pipelined tl.dot: each stage buffers a BM x BK tile of a and a BK x BN tile of b.
DOT = HEADER + '''
@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16))


def launch(a, b, out):
    M, K = a.shape
    N = b.shape[1]
    dot_kernel[(M // 128, N // 128)](a, b, out, M, N, K, BM=128, BN=128, BK=128,
                                     num_warps=8, num_stages=STAGES)
'''

BAD_ARANGE = HEADER + '''
@triton.jit
def bad(x_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)  # BLOCK must be a power of 2
    tl.store(out_ptr + offs, tl.load(x_ptr + offs))


@triton.jit
def fine(x_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs), mask=offs < numel)


def launch(x, out):
    bad[(1,)](x, out, x.numel(), BLOCK=1000)
    fine[(1,)](x, out, x.numel(), BLOCK=1024)
'''


def source(template: str, **consts) -> str:
    return template + "".join(f"{k} = {v!r}\n" for k, v in consts.items())


def test_small_kernel_compiles_for_sm90_with_sane_resources():
    report = compile_resources(source(ADD_ONE, BLOCK=1024, REPEAT=1), EW, EW.dims, H200)
    assert report.ok and report.violations == [] and report.arch == 90
    (k,) = report.kernels
    assert k.name == "add_one" and k.error is None
    assert (k.num_warps, k.num_stages) == (4, 3)
    assert 8 <= k.regs <= 64          # a masked load-add-store needs a few dozen registers
    assert k.spill_bytes == 0 and k.shared_bytes == 0
    assert k.grid == [math.ceil(64 * 256 / 1024), 1, 1]
    assert k.signature == {"x_ptr": "*fp32", "out_ptr": "*fp32", "numel": "i32", "BLOCK": "constexpr"}
    assert k.constexprs == {"BLOCK": 1024}
    assert k.blocks_per_sm == 16      # thread-bound: 2048 / 128
    d = report.to_dict()
    assert d["ok"] is True and d["kernels"][0]["regs"] == k.regs


def test_repeated_launches_compile_once_and_keep_interpret_setting():
    before = os.environ.get("TRITON_INTERPRET")
    report = compile_resources(source(ADD_ONE, BLOCK=256, REPEAT=3), EW, EW.dims, H200)
    (k,) = report.kernels
    assert k.launches == 3
    assert k.grid == [64 * 256 // 256, 1, 1]
    assert os.environ.get("TRITON_INTERPRET") == before


def test_shared_memory_overflow_is_reported_against_h200():
    # 4 stages x (128x128 + 128x128) fp16 = 256 KB > 227 KB; 2 stages fit.
    over = compile_resources(source(DOT, STAGES=4), MM, MM.dims, H200)
    (v,) = [v for v in over.violations if v["kind"] == "smem_overflow"]
    assert v["shared_bytes"] > H200.smem_per_block == v["limit_bytes"]
    assert v["kernel"] == "dot_kernel" and "shared memory" in v["detail"]
    assert not over.ok and over.kernels[0].blocks_per_sm == 0
    fits = compile_resources(source(DOT, STAGES=2), MM, MM.dims, H200)
    assert fits.ok, fits.violations
    assert 0 < fits.kernels[0].shared_bytes <= H200.smem_per_block


def test_register_spills_are_reported():
    spec = EW.with_dims(M=64, N=8192)
    report = compile_resources(source(SPILLER, BLOCK=8192, WARPS=1), spec, spec.dims, H200)
    (v,) = [v for v in report.violations if v["kind"] == "register_spills"]
    k = report.kernels[0]
    assert v["spill_bytes"] == k.spill_bytes > 0
    assert k.regs >= 200              # it spilled because the register file ran out


def test_compile_error_is_a_violation_not_a_crash():
    report = compile_resources(BAD_ARANGE, EW, EW.dims, H200)
    bad, fine = report.kernels
    assert bad.name == "bad" and bad.error
    (v,) = bad.violations
    assert v["kind"] == "compile_error" and "power of 2" in v["detail"]
    # the launch went on: the next kernel was still compiled and judged
    assert fine.name == "fine" and fine.error is None and fine.violations == []
    assert not report.ok and [v["kind"] for v in report.violations] == ["compile_error"]


def test_launch_wrapper_exception_propagates():
    broken = HEADER + "def launch(x, out):\n    raise ValueError('wrapper bug')\n"
    with pytest.raises(ValueError, match="wrapper bug"):
        compile_resources(broken, EW, EW.dims, H200)


def test_specialization_mirrors_triton_launcher():
    import torch
    with compiled_mode():
        mod = load_source(HEADER + '''
@triton.jit
def k(p, n, one, big, f, flag, B: tl.constexpr):
    pass
''', "spec_probe")
    x = torch.empty(64, dtype=torch.bfloat16)
    sig, consts, attrs, opts = specialize(mod.k, (x, 48, 1, 2**40, 0.5, True), {"B": 8, "num_warps": 2})
    assert sig == {"p": "*bf16", "n": "i32", "one": "constexpr", "big": "i64", "f": "fp32", "flag": "i1",
                   "B": "constexpr"}
    assert consts == {"one": 1, "B": 8}
    assert attrs == {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]],
                     (3,): [["tt.divisibility", 16]]}
    assert opts == {"num_warps": 2, "num_stages": 3}


def test_blocks_per_sm_limits():
    assert blocks_per_sm(H200, 128, 32, 0) == 16                  # threads: 2048 / 128
    assert blocks_per_sm(H200, 256, 255, 0) == 1                  # 255 regs -> 8192 per warp
    assert blocks_per_sm(H200, 128, 128, 0) == 4                  # 128 regs -> 16 warps
    assert blocks_per_sm(H200, 128, 32, 100 * 1024) == 2          # shared memory (+1 KB reserved)
    assert blocks_per_sm(H200, 128, 32, H200.smem_per_block + 1) == 0
    assert blocks_per_sm(H200, 1024, 128, 0) == 0                 # 32 warps x 128 regs > 64K
    assert occupancy(H200, 256, 255, 0) == pytest.approx(256 / 2048)


def test_parse_resource_usage_picks_the_named_function():
    text = ("Resource usage:\n Common:\n  GLOBAL:0\n"
            " Function other:\n  REG:10 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:400\n"
            " Function mine:\n  REG:96 STACK:24 SHARED:512 LOCAL:8 CONSTANT[0]:576 TEXTURE:0\n")
    assert parse_resource_usage(text, "mine") == {"REG": 96, "STACK": 24, "SHARED": 512, "LOCAL": 8}
    assert parse_resource_usage(text)["REG"] == 10


@pytest.mark.gpu
def test_offline_registers_match_the_gpu_build():
    """What we read from the cubin equals what the driver reports for the same kernel."""
    import torch
    from mtmc.tools.hardware import present_gpu
    profile = present_gpu()
    report = compile_resources(source(DOT, STAGES=2), MM, MM.dims, profile)
    with compiled_mode():
        mod = load_source(source(DOT, STAGES=2), "gpu_probe")
    a = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    out = torch.empty_like(a)
    compiled = mod.dot_kernel[(2, 2)](a, a, out, 256, 256, 256, BM=128, BN=128, BK=128, num_warps=8, num_stages=2)
    torch.cuda.synchronize()
    k = report.kernels[0]
    assert (k.regs, k.spill_bytes > 0) == (compiled.n_regs, compiled.n_spills > 0)
    assert k.shared_bytes == compiled.metadata.shared


ROWSUM = HEADER + '''
@triton.jit
def rowsum(x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + tl.program_id(0), tl.sum(tl.load(x_ptr + tl.program_id(0) * N + offs), axis=0))


def launch(x, out):
    rowsum[(x.shape[0],)](x, out, N=x.shape[1])
'''


def test_compile_after_the_interpreter_in_one_process():
    """Running an interpreted kernel that calls tl.sum leaves triton.language patched for good
    (and the tests import Triton in interpreter mode): the compile for sm_90 must still work."""
    import torch

    from mtmc.tools.triton_state import compile_blocker, leaked_patches
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the tests run Triton's interpreter in-process only under TRITON_INTERPRET=1")
    mod = load_source(ROWSUM, "interpreted_rowsum")
    x = torch.randn(4, 64)
    out = torch.empty(4)
    mod.launch(x, out)
    assert torch.allclose(out, x.sum(1), atol=1e-5)
    assert leaked_patches(), "the upstream leak is gone: triton_state's reason may be obsolete"
    assert compile_blocker() is not None
    spec = KernelSpec("reduction", "sum", {"M": 4, "N": 64}, "float32")
    report = compile_resources(ROWSUM, spec, spec.dims, H200)
    assert report.ok, report.violations
    assert report.kernels[0].name == "rowsum" and report.kernels[0].regs > 0
    with pytest.raises(ValueError, match="wrapper bug"):
        compile_resources(HEADER + "def launch(x, out):\n    raise ValueError('wrapper bug')\n", spec, spec.dims, H200)


def test_a_gpu_job_compiles_huge_shapes_at_small_dims():
    """On a GPU the check runs at the full size, but the compile's CPU placeholders must not:
    a 4096 x 393216 fp32 ReLU (KernelBench level 1) once asked the compile for a 6.4 GB tensor."""
    from mtmc.kernels.catalog import family_of
    from mtmc.kernels.drafts import COMPILE_NUMEL_LIMIT, build_job
    spec = KernelSpec(family="elementwise", op="relu", dims={"M": 4096, "N": 393216}, dtype="float32")
    config = family_of(spec).default_config(spec, PROFILES["h200"])
    job = build_job(spec, "", config, PROFILES["h200"], gpu=True, baselines=False)
    assert job["dims"] == spec.dims
    assert math.prod(job["compile_dims"].values()) <= COMPILE_NUMEL_LIMIT


def test_fp32_matmul_on_tf32x3_tensor_cores_compiles_for_sm90_within_limits():
    from mtmc.kernels.families.matmul import FAMILY as MATMUL
    spec = KernelSpec("matmul", "matmul", {"M": 512, "N": 512, "K": 512}, "float32", {"b_layout": "nk"})
    config = MATMUL.default_config(spec, PROFILES["h200"])
    assert config["PRECISION"] == "tf32x3"
    report = compile_resources(MATMUL.render(spec, config), spec, None, PROFILES["h200"])
    assert report.ok and report.kernels[0].spill_bytes == 0, report.violations
