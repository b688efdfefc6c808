"""The module verifier (mtmc.tools.guard, `mtmc verify`) against cheating candidates.

Every cheat in tests/cheats/ is named for its trick and must be rejected by the check that
targets that trick; the honest candidates must be accepted.  On this machine everything runs in
Triton's interpreter on CPU tensors; the tests marked gpu run the GPU-only checks.
"""
import json
import math
import tempfile
from pathlib import Path

import pytest
import torch

from mtmc.commands.cli import main
from mtmc.tools.guard.report import format_verdict, phase_line
from mtmc.tools.guard.verifier import check_candidate, run_reference, verify
from mtmc.tools.guard import checks as C
from mtmc.tools.guard import numeric
from mtmc.tools.guard.draw import SIGNED, VARIANTS, vary
from mtmc.tools.worker import run_job

CHEATS = Path(__file__).parent / "cheats"
TIMEOUT_S = 150


def path(name: str) -> str:
    return str(CHEATS / f"{name}.py")


@pytest.fixture(scope="module")
def scale_relu():
    """One trusted reference session shared by the candidates (each still gets its own child)."""
    with run_reference(path("ref_scale_relu"), "cpu", TIMEOUT_S) as ref:
        yield ref


@pytest.fixture(scope="module")
def verdict_of(scale_relu):
    """Each candidate's verdict against the shared reference run, computed once."""
    cache = {}

    def get(name: str, timeout_s: float = TIMEOUT_S) -> dict:
        if name not in cache:
            cache[name] = check_candidate(scale_relu, path(name), timeout_s)
        return cache[name]
    return get


def failed(verdict: dict) -> dict:
    return {c["name"]: c["detail"] for c in verdict["checks"] if c["passed"] is False}


# cheat -> (the check that must catch it, words its detail must contain)
CAUGHT_BY = {
    "cheat_returns_zeros": ("correctness", "outside tolerance"),
    "cheat_returns_constant": ("correctness", "outside tolerance"),
    "cheat_copies_input": ("correctness", "outside tolerance"),
    "cheat_caches_output": ("correctness", "trial 2"),
    "cheat_caches_by_buffer": ("result_caching", "refilled trial 1's input buffers"),
    "cheat_replays_seed": ("correctness", "outside tolerance"),
    "cheat_searches_for_reference": ("correctness", "outside tolerance"),
    "cheat_first_rows_only": ("correctness", "outside tolerance"),
    "cheat_returns_input": ("no_alias", "shares memory with input 0"),
    "cheat_returns_input_view": ("no_alias", "shares memory with input 0"),
    "cheat_modifies_input": ("inputs_unchanged", "input 0"),
    "cheat_calls_torch": ("own_kernels", "no Triton kernel launched"),
    "cheat_dummy_kernel_then_torch": ("own_kernels", "the work is done in PyTorch"),
    "cheat_tensor_subclass": ("output_format", "LazyResult (a torch.Tensor subclass)"),
    "cheat_wrong_dtype": ("output_format", "torch.float64, Model's torch.float32"),
    "cheat_wrong_shape": ("output_format", "shape (1, 24, 40)"),
    "cheat_patches_do_bench": ("timing_functions", "triton.testing.do_bench (after import)"),
    "cheat_patches_perf_counter": ("timing_functions", "time.perf_counter (after import)"),
    "cheat_patches_torch_equal": ("verifier_hooks", "torch.equal"),
    "cheat_background_thread": ("threads_and_streams", "cheat-worker"),
    "cheat_fp16_compute": ("precision", "reduced precision"),
}


@pytest.mark.parametrize("cheat", sorted(CAUGHT_BY))
def test_cheat_is_rejected_for_its_trick(verdict_of, cheat):
    v = verdict_of(cheat)
    name, words = CAUGHT_BY[cheat]
    assert v["outcome"] == "rejected" and not v["accepted"], format_verdict(v)
    assert name in failed(v), format_verdict(v)
    assert words in failed(v)[name], format_verdict(v)


def test_checks_do_not_blame_what_a_cheat_did_right(verdict_of):
    """A cheat that only breaks one rule fails that check alone: the checks are specific."""
    for cheat, only in (("cheat_wrong_dtype", "output_format"), ("cheat_modifies_input", "inputs_unchanged"),
                        ("cheat_calls_torch", "own_kernels"), ("cheat_patches_do_bench", "timing_functions")):
        assert set(failed(verdict_of(cheat))) == {only}, (cheat, failed(verdict_of(cheat)))


def test_honest_kernel_is_accepted(verdict_of):
    v = verdict_of("honest_scale_relu")
    assert v["accepted"] and v["outcome"] == "accepted", format_verdict(v)
    by_name = {c["name"]: c for c in v["checks"]}
    for name in ("loads", "runs", "timing_functions", "verifier_hooks", "threads_and_streams", "inputs_unchanged",
                 "no_alias", "output_format", "own_kernels", "correctness", "precision", "tolerance_discriminates"):
        assert by_name[name]["passed"] is True, by_name[name]
    assert by_name["roofline"]["passed"] is None  # no GPU here: not measured, not guessed
    assert [t["variant"] for t in v["trials"]] == list(VARIANTS)
    assert 0 <= v["max_abs_err"] < 1e-4 and v["tol_ratio"] < 1
    assert "_scale_relu_kernel x1" in by_name["own_kernels"]["detail"]


def test_honest_kernel_from_mtmc_codegen_is_accepted():
    v = verify(path("ref_softmax"), path("honest_softmax"), device="cpu", timeout_s=TIMEOUT_S)
    assert v["accepted"], format_verdict(v)
    assert "softmax_kernel" in next(c for c in v["checks"] if c["name"] == "own_kernels")["detail"]
    # where its seconds went: every job of both sessions, in call order, the reference's opening first
    kinds = [k for k, _ in v["phases"]]
    parts = ["reference_open import", "reference_open build", "reference_open float64 copy",
             "reference_open ipc probe", "reference_open mode probe"]   # the opening split where it goes
    assert kinds == ["reference_open", *parts, "reference_state", "candidate_open"] + \
        ["reference_variant", "candidate_trial", "reference_judge"] * len(v["variants"])
    assert all(s >= 0 for _, s in v["phases"]) and v["phases"][0][1] > 0 and dict(v["phases"])["candidate_open"] > 0
    line = phase_line(v["phases"])
    # the total as phase_line sums it (in its own order: 12.9 beside 13.0 when it sits on .x5)
    total, rest = line.split(" s: ", 1)
    assert abs(float(total) - sum(s for _, s in v["phases"])) <= 0.051 and rest.startswith("reference open ")
    assert f"candidate trial {len(v['variants'])}x " in line


def test_phase_line_sums_each_kind_once_in_order():
    assert phase_line([["a_b", 1.0], ["c", 2.25], ["a_b", 0.5], ["d", 0.01]]) == "3.8 s: a b 2x 1.5 (1.0+0.5), c 2.2"
    assert phase_line([]) == ""


def test_reference_outputs_never_reach_the_candidate(verdict_of, scale_relu):
    """The candidate's child searches its memory and the verifier's temporary files and finds
    nothing: the reference's outputs stay in the reference's session."""
    v = verdict_of("cheat_searches_for_reference")
    # the reference never writes its outputs anywhere; what the check shared is gone with it
    assert not [p for p in scale_relu.exchange.rglob("*") if p.is_file()]
    assert "reference output found: False" in v["stderr_tail"]
    assert "reference output found: True" not in v["stderr_tail"]


def test_hang_is_contained_as_timed_out(scale_relu):
    v = check_candidate(scale_relu, path("cheat_hangs"), 45)
    assert v["outcome"] == "timed out" and not v["accepted"]
    assert "no result within 45 s" in failed(v)["runs"]
    assert run_job({"kind": "ping"}, timeout_s=60)["status"] == "ok"  # the caller keeps serving


@pytest.mark.parametrize("cheat,why", [("cheat_aborts", "SIGABRT"), ("cheat_segfaults", "SIGSEGV"),
                                       ("cheat_allocates_forever", "MemoryError")])
def test_crash_is_contained_as_crashed(verdict_of, cheat, why):
    v = verdict_of(cheat)
    assert v["outcome"] == "crashed" and not v["accepted"]
    assert why in failed(v)["runs"]
    assert run_job({"kind": "ping"}, timeout_s=60)["status"] == "ok"


def _shared_dir(ref) -> str:
    """A directory the reference's session can write (inside its exchange directory)."""
    from mtmc.tools.isolation import give_to_sandbox
    d = Path(tempfile.mkdtemp(dir=ref.exchange))
    give_to_sandbox(d)
    return str(d)


def test_inputs_are_fresh_and_varied_on_every_run(scale_relu):
    from mtmc.tools.guard.exchange import receive
    with run_reference(path("ref_scale_relu"), "cpu", TIMEOUT_S) as again:
        assert scale_relu.variants == again.variants == list(VARIANTS)
        for i in range(len(VARIANTS)):
            a = scale_relu.call("reference_variant", index=i, dir=_shared_dir(scale_relu))
            b = again.call("reference_variant", index=i, dir=_shared_dir(again))
            assert a["variant"] == VARIANTS[i] and a["inputs_fingerprint"] != b["inputs_fingerprint"]
        state_a = receive(scale_relu.call("reference_state", dir=_shared_dir(scale_relu))["payload"])
        state_b = receive(again.call("reference_state", dir=_shared_dir(again))["payload"])
    assert not torch.equal(state_a["state"]["weight"], state_b["state"]["weight"])  # fresh parameters too
    assert not again.session.alive and not again.exchange.exists()


def test_variant_distributions():
    from mtmc.tools.loader import load_file
    from mtmc.tools.guard.draw import draw_inputs
    module = load_file(path("ref_scale_relu"), "draw_probe")
    normal, heavy = draw_inputs(module.get_inputs, "as_given")[0][0], draw_inputs(module.get_inputs, "heavy_tailed")[0][0]
    beyond_3_sigma = lambda t: float((t.abs() > 3).float().mean())  # noqa: E731  (templates are N(0, 1))
    assert beyond_3_sigma(normal) < 0.05 < beyond_3_sigma(heavy)  # Cauchy: ~20 % of values beyond 3


def test_variants_keep_nonnegative_inputs_nonnegative():
    gen = torch.Generator().manual_seed(1)
    template = torch.rand(64, 64)
    for variant in VARIANTS:
        x = vary(template, variant, gen)
        assert x.shape == template.shape and x.dtype == template.dtype and bool((x >= 0).all())
    signed = torch.randn(256)
    shifted = vary(signed, "offset_scaled", gen)  # an affine map: scale in [1/4, 4] and an offset
    scale = float(shifted.std() / signed.std())
    assert 0.25 <= scale <= 4 and torch.allclose(shifted, signed * scale + (shifted - signed * scale).mean(), atol=1e-5)
    idx = torch.randint(0, 5, (10,))
    assert vary(idx, "heavy_tailed", gen) is idx  # indices are left as drawn


def test_nonnegative_inputs_get_one_trial_with_both_signs():
    gen = torch.Generator().manual_seed(2)
    x = vary(torch.rand(64, 64), SIGNED, gen)
    assert float((x < 0).float().mean()) > 0.3 and float((x > 0).float().mean()) > 0.3


def test_a_signed_trial_tells_relu_from_a_copy_on_nonnegative_inputs():
    """On torch.rand inputs relu is the identity on every sign-keeping variant: KernelBench's ELU
    task was refused as "cannot be told from a copy of input 0", even for an honest kernel (H100,
    2026-12-06).  The signed trial accepts the relu and rejects the copy for being wrong."""
    honest = verify(path("ref_relu_of_rand"), path("honest_relu"), device="cpu", timeout_s=TIMEOUT_S)
    assert honest["accepted"], failed(honest)
    assert honest["variants"] == [*VARIANTS, SIGNED]
    cheat = verify(path("ref_relu_of_rand"), path("honest_copy"), device="cpu", timeout_s=TIMEOUT_S)
    assert not cheat["accepted"] and set(failed(cheat)) == {"correctness"}
    assert "trial 4 (signed)" in failed(cheat)["correctness"]


def test_the_signed_trial_falls_back_where_model_is_not_finite():
    v = verify(path("ref_sqrt_of_rand"), path("honest_copy"), device="cpu", timeout_s=TIMEOUT_S)
    assert v["variants"] == [*VARIANTS, SIGNED]
    assert any("signed: Model's output is not finite" in n for n in v["notes"]), v["notes"]
    assert not v["accepted"] and "correctness" in failed(v)


def test_tolerance_that_cannot_discriminate_rejects_even_honest_work():
    v = verify(path("ref_identity"), path("honest_copy"), device="cpu", timeout_s=TIMEOUT_S)
    assert not v["accepted"]
    assert "cannot be told from a copy of input 0" in failed(v)["tolerance_discriminates"]
    assert {c["name"] for c in v["checks"] if c["passed"] is False} == {"tolerance_discriminates"}


def test_an_output_that_is_one_constant_everywhere_is_judged():
    """Model's output is 1 on every input (a softmax over a size-1 dim): zeros and "a constant"
    cannot be told from the truth there because the truth is a constant.  Returning it is right;
    zeros still fail, and one variant's constant does not excuse a loose bound on the others."""
    honest = verify(path("ref_constant_output"), path("honest_constant_output"), device="cpu", timeout_s=TIMEOUT_S)
    assert honest["accepted"], failed(honest)
    detail = next(c["detail"] for c in honest["checks"] if c["name"] == "tolerance_discriminates")
    assert "is 1 everywhere on every input drawn" in detail
    zeros = verify(path("ref_constant_output"), path("cheat_wrong_constant"), device="cpu", timeout_s=TIMEOUT_S)
    assert not zeros["accepted"] and "correctness" in failed(zeros)
    loose = [{"loose": [["zeros"]], "constant": [c]} for c in (0.0, None, None)]
    assert C.tolerance_discriminates(loose)["passed"] is False


def test_an_output_that_is_zero_up_to_rounding_is_judged():
    """L2 23 (Conv3d, GroupNorm, mean) was refused even with every group left to PyTorch, "cannot
    be told from zeros": its true output is 0 and eager's is rounding noise.  Zeros are right
    there; a wrong constant is still caught by the bound, and the synthetic case where zeros
    pass only through a loose bound (no rounding-zero mark) is still refused."""
    honest = verify(path("ref_rounding_zero"), path("honest_rounding_zero"), device="cpu", timeout_s=TIMEOUT_S)
    assert honest["accepted"], failed(honest)
    detail = next(c["detail"] for c in honest["checks"] if c["name"] == "tolerance_discriminates")
    assert "is 0 on every input drawn" in detail
    metas = [{"loose": [["zeros", "a constant"]], "constant": [None], "rounding_zero": [z]} for z in (True, True, False)]
    assert C.tolerance_discriminates(metas)["passed"] is False
    assert C.tolerance_discriminates([{**m, "rounding_zero": [True]} for m in metas])["passed"] is True


def test_rounding_zero_needs_the_truth_far_below_eagers_error():
    x = torch.randn(8, 16, 32, dtype=torch.float64)
    norm = torch.nn.GroupNorm(4, 16).double()
    ref = norm(x).mean(dim=[1, 2])
    eager = norm.float()(x.float()).mean(dim=[1, 2])
    assert numeric.rounding_zero(ref, eager)
    # a small but real output (1e-6 of x's scale) is not rounding
    assert not numeric.rounding_zero(x.mean(dim=[1, 2]) * 1e-6, (x.float().mean(dim=[1, 2]) * 1e-6))


def test_a_loss_with_one_output_value_is_judged_and_a_constant_loss_is_caught():
    """A scalar output is its own mean: the "a constant" fake once equalled the truth on every
    variant, so every loss module was refused as "cannot be told from a constant", honest or not."""
    honest = verify(path("ref_mse_loss"), path("honest_mse_loss"), device="cpu", timeout_s=TIMEOUT_S)
    assert honest["accepted"], failed(honest)
    cheat = verify(path("ref_mse_loss"), path("cheat_constant_loss"), device="cpu", timeout_s=TIMEOUT_S)
    assert not cheat["accepted"] and "tolerance_discriminates" not in failed(cheat)


def test_tolerance_rejects_zeros_constant_and_input_copy():
    """The bound itself on a typical output: each fake fails, the truth rounded to fp32 passes."""
    x = torch.randn(16, 32, dtype=torch.float64)
    ref = torch.softmax(x, -1)
    eager = torch.softmax(x.float(), -1)
    assert numeric.compare(ref.float(), ref, eager)["ok"]
    for name, fake in numeric.fakes(ref, eager, [x.float()]).items():
        assert not numeric.compare(fake, ref, eager)["ok"], name


def test_precision_flags_half_precision_work_only():
    x = torch.randn(4096, dtype=torch.float64)
    ref = x * 1.7 + 0.3
    eager = (x.float() * 1.7 + 0.3)
    half = (x.half() * 1.7 + 0.3).float()
    bf16 = (x.bfloat16() * 1.7 + 0.3).float()
    assert not numeric.precision_loss(eager, ref, eager)["reduced"]
    assert numeric.precision_loss(half, ref, eager)["reduced"]
    assert numeric.precision_loss(bf16, ref, eager)["reduced"]
    assert not numeric.precision_loss(torch.zeros_like(eager), ref, eager)["reduced"]  # wrong, not imprecise
    assert numeric.precision_loss(half.half(), ref, half.half()) is None  # an fp16 task may be fp16


def test_roofline_flags_speed_beyond_memory_bandwidth():
    nbytes = 512 * 2**20
    floor_ms = numeric.roofline_floor_ms(nbytes, 4300.0)
    assert floor_ms == pytest.approx(nbytes / 4.3e12 * 1e3)
    assert C.roofline(floor_ms * 0.1, nbytes, 4300.0, "H200")["passed"] is False
    assert C.roofline(floor_ms * 1.5, nbytes, 4300.0, "H200")["passed"] is True
    assert C.roofline(None, nbytes, 4300.0, "H200")["passed"] is None


def test_compare_ignores_only_what_pytorch_itself_cannot_represent():
    ref = torch.tensor([1.0, 2.0, 1e6], dtype=torch.float64)
    eager = torch.tensor([1.0, 2.0, math.inf], dtype=torch.float16)
    ok = numeric.compare(torch.tensor([1.0, 2.0, math.inf], dtype=torch.float16), ref, eager)
    assert ok["ok"] and "1 elements not judged" in ok["reason"]
    nan = numeric.compare(torch.tensor([1.0, math.nan, math.inf], dtype=torch.float16), ref, eager)
    assert not nan["ok"] and "NaN or inf" in nan["reason"]


# -- command line ----------------------------------------------------------------------------

def test_cli_exit_codes_and_json(capsys, tmp_path):
    assert main(["verify", path("ref_scale_relu"), path("honest_scale_relu"), "--device", "cpu", "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["accepted"] and verdict["outcome"] == "accepted"
    assert main(["verify", path("ref_scale_relu"), path("cheat_calls_torch"), "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "verdict: REJECTED" in out and "[FAIL] own_kernels" in out
    assert main(["verify", path("ref_scale_relu"), str(tmp_path / "missing.py")]) == 2
    (tmp_path / "model.txt").write_text("class ModelNew: pass\n")
    assert main(["verify", path("ref_scale_relu"), str(tmp_path / "model.txt")]) == 2
    bad_ref = tmp_path / "bad_ref.py"
    bad_ref.write_text("import torch\nclass Model(torch.nn.Module):\n    pass\n")
    assert main(["verify", str(bad_ref), path("honest_scale_relu"), "--device", "cpu"]) == 2
    assert "get_inputs" in capsys.readouterr().out


# -- GPU only ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scale_relu_gpu():
    return run_reference(path("ref_scale_relu"), "cuda", TIMEOUT_S)


@pytest.mark.gpu
def test_gpu_honest_kernel_is_accepted_and_timed(scale_relu_gpu):
    v = check_candidate(scale_relu_gpu, path("honest_scale_relu"), TIMEOUT_S)
    assert v["accepted"], format_verdict(v)
    assert v["timing"]["measured"] and v["timing"]["ours_ms"] > 0 and v["timing"]["eager_ms"] > 0
    by_name = {c["name"]: c for c in v["checks"]}
    assert by_name["roofline"]["passed"] is True and by_name["timed_output"]["passed"] is True


@pytest.mark.gpu
def test_gpu_side_stream_is_caught(scale_relu_gpu):
    v = check_candidate(scale_relu_gpu, path("cheat_side_stream"), TIMEOUT_S)
    assert not v["accepted"] and "CUDA streams created" in failed(v)["threads_and_streams"]


@pytest.mark.gpu
def test_gpu_pytorch_work_is_seen_by_the_profiler(scale_relu_gpu):
    v = check_candidate(scale_relu_gpu, path("cheat_calls_torch"), TIMEOUT_S)
    assert "own_kernels" in failed(v)


@pytest.mark.gpu
def test_gpu_speed_beyond_the_roofline_is_caught():
    ref = run_reference(path("ref_scale_relu_large"), "cuda", TIMEOUT_S)
    v = check_candidate(ref, path("cheat_memoizes_by_pointer"), TIMEOUT_S)
    assert not v["accepted"] and "roofline" in failed(v), format_verdict(v)


@pytest.mark.gpu
def test_gpu_illegal_memory_access_is_contained(scale_relu_gpu, capsys):
    v = check_candidate(scale_relu_gpu, path("cheat_illegal_address"), TIMEOUT_S)
    assert v["outcome"] == "crashed" and not v["accepted"]
    assert "runs" in failed(v)
    assert check_candidate(scale_relu_gpu, path("honest_scale_relu"), TIMEOUT_S)["accepted"]  # still serving
    # the command line gives the same verdict and exit code, and says what happened
    assert main(["verify", path("ref_scale_relu"), path("cheat_illegal_address")]) == 1
    assert "CRASHED" in capsys.readouterr().out


# -- one catalog kernel through the same checks -----------------------------------------------

def test_a_catalog_kernel_goes_through_the_same_checks():
    from mtmc.kernels.catalog import family_of
    from mtmc.kernels.spec import KernelSpec
    from mtmc.kernels.module_pair import verify_kernel
    from mtmc.tools.hardware import resolve

    def render(spec):
        fam = family_of(spec)
        return fam.render(spec, fam.default_config(spec, resolve("h200")))
    relu = KernelSpec("elementwise", "chain", {"M": 16, "N": 40}, "float32", {"chain": [{"op": "relu"}]})
    v = verify_kernel(relu, render(relu), device="cpu", timeout_s=TIMEOUT_S)
    assert v["accepted"], format_verdict(v)
    gelu = KernelSpec("elementwise", "chain", {"M": 16, "N": 40}, "float32", {"chain": [{"op": "gelu"}]})
    v = verify_kernel(relu, render(gelu), device="cpu", timeout_s=TIMEOUT_S)  # the wrong op's kernel
    assert not v["accepted"] and "correctness" in failed(v)


def test_a_model_random_in_training_mode_is_compared_in_eval_mode():
    v = verify(path("ref_dropout_scale_relu"), path("honest_scale_relu"), device="cpu", timeout_s=TIMEOUT_S)
    assert v["accepted"], format_verdict(v)
    assert any("eval mode" in n for n in v["notes"])


def test_verdict_in_the_module_checks_shape(verdict_of):
    from mtmc.tools.guard.report import as_module_check
    bad = as_module_check(verdict_of("cheat_calls_torch"))
    assert bad["status"] == "failed" and bad["reason"].startswith("rejected: own_kernels:")
    assert as_module_check(verdict_of("honest_scale_relu"))["status"] == "passed"


# -- what a check leaves behind ---------------------------------------------------------------

def _tree_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def test_disk_use_is_small_and_cleaned_up_even_when_a_child_crashes(tmp_path, monkeypatch):
    """Every file of a check lives under TMPDIR while it runs, stays far below the inputs'
    size on a GPU (handles, not data) and small here, and is gone afterwards, crash or not."""
    import threading
    import time
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None   # re-read TMPDIR in this process too
    peak, done = [0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], _tree_bytes(tmp_path))
            time.sleep(0.05)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with run_reference(path("ref_scale_relu"), "cpu", TIMEOUT_S) as ref:
            assert check_candidate(ref, path("honest_scale_relu"), TIMEOUT_S)["accepted"]
            assert check_candidate(ref, path("cheat_segfaults"), TIMEOUT_S)["outcome"] == "crashed"
            assert any(tmp_path.iterdir())   # the sessions' scratch and the exchange live there
    finally:
        done.set()
        watcher.join()
        tempfile.tempdir = None
    # torch's compile cache (torchinductor_USER) is shared by design; nothing of the check remains
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("torchinductor_")] == []
    assert 0 < peak[0] < 16 << 20, peak[0]   # the ref_scale_relu inputs are a few KB


def test_shared_tensors_cannot_smuggle_code(tmp_path):
    """The receiving side unpickles CUDA handles with a whitelist: anything else is refused."""
    import base64
    import pickle

    from mtmc.tools.guard.exchange import ExchangeError, receive, share
    payload = share({"outputs": [torch.ones(3)], "n": 2}, tmp_path, "ok")
    got = receive(payload)
    assert torch.equal(got["outputs"][0], torch.ones(3)) and got["n"] == 2

    class Evil:
        def __reduce__(self):
            return (print, ("owned",))
    payload["ipc"] = base64.b64encode(pickle.dumps([Evil()])).decode()
    with pytest.raises(ExchangeError, match="refused builtins.print"):
        receive(payload)
    with pytest.raises(ExchangeError, match="more than 10"):
        receive({"file": payload["file"]}, limit_bytes=10)


def test_the_batch_is_cut_only_where_cuda_tensors_must_cross_as_files():
    from mtmc.tools.guard.exchange import STAGED_MAX_ELEMS, staged_cap
    assert staged_cap("cpu", None, lambda: False) is None            # the interpreter: its own cap or none
    assert staged_cap("cuda", None, lambda: True) is None            # IPC handles: full size, no files
    assert staged_cap("cuda", None, lambda: False) == STAGED_MAX_ELEMS
    assert staged_cap("cuda", 1000, lambda: False) == 1000           # a smaller cap asked for stays


def test_the_next_candidate_session_starts_before_its_check(tmp_path):
    """With the candidates' folder named, the first candidate session starts beside the reference's
    opening and (keep_spare) the next one after each check; a candidate elsewhere gets a session of
    its own.  Every verdict is the same as with fresh sessions: a cheat is still caught."""
    with run_reference(path("ref_scale_relu"), "cpu", TIMEOUT_S, candidates_in=CHEATS) as ref:
        first = ref.spare
        assert first is not None and first.session.alive and first.folder == str(CHEATS.resolve())
        v = check_candidate(ref, path("honest_scale_relu"), TIMEOUT_S)
        assert v["accepted"], format_verdict(v)
        assert ref.spare is None and not first.session.alive and not first.directory.exists()
        ref.keep_spare = True
        v = check_candidate(ref, path("cheat_returns_input"), TIMEOUT_S)
        assert not v["accepted"] and "correctness" in failed(v)
        nxt = ref.spare
        assert nxt is not None and nxt.session.alive
        tmp_path.chmod(0o755)   # the sandbox user reads it in place, with the kernels it imports
        for name in ("honest_scale_relu", "_kernels"):
            (tmp_path / f"{name}.py").write_text(Path(path(name)).read_text())
        v = check_candidate(ref, str(tmp_path / "honest_scale_relu.py"), TIMEOUT_S)   # not in the spare's folder
        assert not nxt.session.alive and ref.spare is not nxt
        assert v["accepted"], format_verdict(v)
    assert ref.spare is None or not ref.spare.session.alive


def test_the_state_a_forward_updates_must_follow_models():
    """A training-mode BatchNorm moves its running statistics on every call; a ModelNew with the
    right outputs that skips the update (or does it twice) leaves a different model behind."""
    honest = verify(path("ref_batchnorm"), path("honest_batchnorm"), device="cpu", timeout_s=TIMEOUT_S)
    assert honest["accepted"], format_verdict(honest)
    assert {c["name"]: c["passed"] for c in honest["checks"]}["state_follows"] is True
    cheat = verify(path("ref_batchnorm"), path("cheat_skips_running_stats"), device="cpu", timeout_s=TIMEOUT_S)
    assert not cheat["accepted"] and set(failed(cheat)) == {"state_follows"}, format_verdict(cheat)
    assert "bn.running_mean" in failed(cheat)["state_follows"], format_verdict(cheat)


def test_a_model_that_keeps_state_between_calls_is_checked_not_taken_for_random():
    """VanillaRNNHidden's forward assigns self.hidden: two calls of one copy differ, and the probe
    for randomness (two calls on the same inputs) skipped its check as "random even in eval mode";
    the probe now runs two fresh copies, and the check runs Model and ModelNew in lockstep."""
    v = verify(path("ref_stateful"), path("honest_stateful"), device="cpu", timeout_s=TIMEOUT_S)
    assert v["accepted"], format_verdict(v)


def test_a_closure_stored_on_model_follows_the_guards_copies():
    """minGPT's block calls its MLP through `self.mlpf = lambda x: ...`: the guard's deepcopy kept
    the closure on the original's layers, so the float64 copy failed ("no float64 truth") and the
    eval-mode copies ran the original's training-mode dropout ("random even in eval mode")."""
    v = verify(path("ref_closure_mlp"), path("honest_closure_mlp"), device="cpu", timeout_s=TIMEOUT_S)
    assert v["accepted"], format_verdict(v)
    assert any("eval mode" in n for n in v["notes"]) and not any("float64" in n for n in v["notes"]), v["notes"]


def test_modelnew_is_built_under_models_seed():
    """A tensor Model's constructor draws outside its state_dict (KernelBench's LSTMs keep h0 =
    torch.randn(...)) came out different in ModelNew, so even an all-PyTorch ModelNew was rejected:
    the candidate now builds ModelNew under the seed the reference built Model with."""
    v = verify(path("ref_init_state"), path("honest_init_state"), device="cpu", timeout_s=TIMEOUT_S)
    assert v["accepted"], format_verdict(v)


def test_state_is_judged_after_the_first_call_only():
    """On a GPU both sides are timed after the first trial, a different number of calls each (the
    H100 run of KernelBench L2 73 compared num_batches_tracked 116 against 62 and rejected even an
    all-PyTorch ModelNew): later trials' states say nothing."""
    from mtmc.tools.guard import checks as C
    later = [{"state_changed": []}, {"state_changed": ["bn.num_batches_tracked ([116] where Model has [62])"]}]
    assert C.state_follows(later)["passed"] is True
    first = [{"state_changed": ["bn.running_mean (max abs difference 0.7)"]}, {"state_changed": []}]
    assert C.state_follows(first)["passed"] is False


def test_running_statistics_are_judged_against_float64_where_models_own_are_off():
    """ResNet18 on the H100: eager's TF32 convs moved layer4's running means 2.3e-5 from the
    float64 truth, ModelNew's more accurate convs did not, and the state check (against eager,
    atol 1e-5) rejected the whole module.  A buffer no further from float64 than Model's own now
    passes; one that skipped its update still fails."""
    from mtmc.tools.guard.reference import _state_changes
    torch.manual_seed(0)
    exact = torch.rand(64, dtype=torch.float64) * 1e-2
    eager = (exact + 3e-5 * torch.randn(64, dtype=torch.float64)).float()   # TF32-rounded statistics
    closer = (exact + 2e-6 * torch.randn(64, dtype=torch.float64)).float()
    want, truth = {"bn.running_mean": eager}, {"bn.running_mean": exact}
    assert _state_changes({"bn.running_mean": closer}, want) != []          # against eager alone: off
    assert _state_changes({"bn.running_mean": closer}, want, truth) == []   # against float64: closer
    skipped = {"bn.running_mean": torch.zeros(64)}
    (why,) = _state_changes(skipped, want, truth)
    assert "bn.running_mean" in why and "float64" in why


def test_a_model_sized_by_its_batch_is_checked_on_the_whole_batch(monkeypatch):
    """KernelBench L3 Mamba2 keeps parameters of the batch's size: the guard's batch cut (inputs
    staged through files on a GPU without CUDA IPC) made Model fail, and the whole module went
    unchecked.  Where the whole batch fits the files' cap, the check now runs on it."""
    import types
    from mtmc.tools.guard import reference as R

    class Sized(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.randn(8, 4))

        def forward(self, x):
            return x * self.p   # only a batch of 8 broadcasts

    module = types.SimpleNamespace(get_inputs=lambda: [torch.rand(8, 4)])
    try:
        R._RUN.update(module=module, device="cpu", max_elems=8)
        monkeypatch.setattr(R, "_uncut_fits", lambda: False)
        with pytest.raises(ValueError, match="rejects a smaller batch"):
            R._mode(Sized())
        monkeypatch.setattr(R, "_uncut_fits", lambda: True)
        mode, _, _ = R._mode(Sized())
        assert mode == "train" and R._RUN["max_elems"] is None
    finally:
        R._RUN.clear()


def test_the_float64_copy_starts_each_call_from_models_statistics():
    """On a GPU the reference times Model between checks, which moves a training-mode BatchNorm's
    running statistics; the float64 copy, not timed, lagged behind, so its state after a later
    check's first call was no truth for Model's.  Each call now starts it from Model's buffers."""
    import copy
    from mtmc.tools.guard.reference import _sync_buffers
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    model64 = copy.deepcopy(model).double()
    with torch.no_grad():
        for _ in range(3):   # the timing calls
            model(torch.randn(8, 4))
    before = {k: v.detach().clone() for k, v in model.named_buffers()}
    _sync_buffers(model64, before)
    for k, b in model64.named_buffers():
        assert b.dtype == (torch.float64 if b.is_floating_point() else before[k].dtype)
        torch.testing.assert_close(b, before[k].to(b.dtype))
