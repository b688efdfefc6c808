"""The named checks of a module verification, judged in the parent from what the candidate's
session observed (obs), what the reference session measured per variant (metas) and its
judgement of the candidate's outputs per trial (judged: guard.reference.judge_job's results).

Each check is {"name", "passed": True | False | None (does not apply here), "detail"}.
"""
from __future__ import annotations

from mtmc.tools.guard import numeric

ROOFLINE_SLACK = 0.8  # measured bandwidth is ~90 % of peak; faster than 80 % of the floor is impossible


def check(name: str, passed: bool | None, detail: str) -> dict:
    return {"name": name, "passed": passed, "detail": detail}


def _ops_text(ops: dict) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted(ops.items())) or "none"


def loads(obs: dict) -> dict:
    err = obs.get("error")
    if obs.get("loaded"):
        return check("loads", True, "ModelNew(*get_init_inputs()) built; Model's state_dict loaded (strict)")
    if err and err["stage"] in ("import", "construct"):
        return check("loads", False, f"{err['stage']}: {err['type']}: {err['message']}")
    return check("loads", False, "the candidate did not load")


def runs(obs: dict, n_trials: int) -> dict:
    err = obs.get("error")
    if err and err["stage"] not in ("import", "construct"):
        return check("runs", False, f"{err['stage']}: {err['type']}: {err['message']}")
    if obs.get("loaded") and len(obs.get("trials", [])) == n_trials:
        return check("runs", True, f"forward ran on {n_trials} fresh inputs")
    return check("runs", False if obs.get("loaded") else None, "forward did not run")


def _tampered(obs: dict, kind: str, name: str, what: str) -> dict:
    hits = [t for t in obs.get("tampered", []) if t["kind"] == kind]
    if hits:
        return check(name, False, "replaced: " + "; ".join(f"{t['path']} ({t['when']})" for t in hits))
    return check(name, True, f"{what} are the same objects after import and after every call")


def timing_functions(obs: dict) -> dict:
    return _tampered(obs, "timing", "timing_functions", "time.perf_counter, do_bench, CUDA events and synchronize")


def verifier_hooks(obs: dict) -> dict:
    return _tampered(obs, "hooks", "verifier_hooks", "the functions the verifier observes with")


def threads_and_streams(obs: dict) -> dict:
    t, s = obs.get("threads", {}), obs.get("streams", {})
    problems = []
    if t.get("python"):
        problems.append(f"Python threads still running: {', '.join(t['python'])}")
    if t.get("native"):
        problems.append(f"{t['native']} native threads started")
    if s.get("created"):
        problems.append(f"{s['created']} CUDA streams created")
    if s.get("current_changed"):
        problems.append("the current CUDA stream was left changed")
    if len(s.get("used", [])) > 1:
        problems.append(f"kernels ran on {len(s['used'])} streams")
    if problems:
        return check("threads_and_streams", False, "; ".join(problems))
    return check("threads_and_streams", True, "no thread or stream outlives the call")


def no_alias(obs: dict) -> dict:
    found = [f"trial {i + 1}: {a}" for i, tr in enumerate(obs.get("trials", [])) for a in tr["aliases"]]
    if found:
        return check("no_alias", False, "; ".join(found[:4]))
    return check("no_alias", True, "no output shares memory with an input")


def output_format(obs: dict, judged: list) -> dict:
    """Plain dense tensors (seen in the child), as many as Model's, of its shapes and dtypes."""
    problems = [f"trial {i + 1}: {p}" for i, tr in enumerate(obs.get("trials", [])) for p in tr["format"]]
    for i, jd in enumerate(judged):
        if jd["count"] != len(jd["outputs"]):
            problems.append(f"trial {i + 1}: {jd['count']} outputs, Model gives {len(jd['outputs'])}")
        problems += [f"trial {i + 1}: {p}" for out in jd["outputs"] for p in out["format"]]
    if problems:
        return check("output_format", False, "; ".join(dict.fromkeys(problems)))
    return check("output_format", True, "plain tensors of Model's shapes, dtypes and device")


def inputs_unchanged(judged: list) -> dict:
    changed = [f"trial {i + 1}: input {j}" for i, jd in enumerate(judged) for j in jd.get("inputs_changed", [])]
    if changed:
        return check("inputs_unchanged", False, "modified by the call: " + ", ".join(changed[:6]))
    return check("inputs_unchanged", True, "every input is bit-for-bit what it was given")


def state_follows(judged: list) -> dict:
    """The state a forward leaves behind (a training-mode BatchNorm's running statistics and
    batch count) must be Model's after every call: skipping the update, or doing it twice (a
    layer left running beside the kernel that replaced it), changes every later eval-mode call.
    Compared after the first call (later ones follow timing runs, a different number on each side)."""
    changed = [what for jd in judged[:1] for what in jd.get("state_changed", [])]
    if changed:
        return check("state_follows", False, "ModelNew's buffers after its first call differ from Model's: "
                     + ", ".join(changed[:4]))
    return check("state_follows", True, "the buffers the forward updates match Model's after the first call")


def own_kernels(obs: dict, ref_ops: dict) -> dict:
    """The candidate must do the work in its own Triton kernels: a call that launches none, or
    that runs at least as many PyTorch compute ops as the reference itself, does it in PyTorch.
    On a GPU the profiler must also show Triton kernels among those that ran."""
    ref_total = sum(ref_ops.values())
    if ref_total == 0:
        return check("own_kernels", None, "the reference does no compute")
    trials = obs.get("trials", [])
    for i, tr in enumerate(trials):
        if not tr["launches"]:
            return check("own_kernels", False, f"trial {i + 1}: no Triton kernel launched; PyTorch computed: "
                         f"{_ops_text(tr['ops'])}")
        if sum(tr["ops"].values()) >= ref_total:
            return check("own_kernels", False, f"trial {i + 1}: {sum(tr['ops'].values())} PyTorch compute ops "
                         f"({_ops_text(tr['ops'])}), as many as the reference's {ref_total} "
                         f"({_ops_text(ref_ops)}): the work is done in PyTorch")
    prof = obs.get("profile")
    if prof and prof["other"] and not prof["triton"]:
        names = sorted({k["name"][:60] for k in prof["other"]})
        return check("own_kernels", False, f"the profiler saw no Triton kernel, only: {', '.join(names[:5])}")
    if not trials:
        return check("own_kernels", None, "forward did not run")
    launches = {k: v for tr in trials[:1] for k, v in tr["launches"].items()}
    detail = (f"{sum(launches.values())} Triton launches per call ({_ops_text(launches)}); PyTorch compute "
              f"ops: {_ops_text(trials[0]['ops'])} (the reference has {ref_total})")
    if prof:
        other = sum(k["us"] for k in prof["other"])
        total = other + sum(k["us"] for k in prof["triton"])
        detail += f"; non-Triton GPU kernels take {other / total:.0%} of the GPU time" if total else ""
    return check("own_kernels", True, detail)


def correctness(judged: list, metas: list) -> tuple[dict, list, dict]:
    """(check, per-trial results, worst errors) of every output of every trial."""
    trials, worst, failed = [], {"max_abs_err": 0.0, "rel_err": 0.0, "tol_ratio": 0.0}, []
    for i, (jd, meta) in enumerate(zip(judged, metas)):
        results = [out["compare"] for out in jd["outputs"]]
        for j, res in enumerate(results):
            for k in worst:
                worst[k] = max(worst[k], res[k])
            if not res["ok"]:
                failed.append(f"trial {i + 1} ({meta['variant']}) output {j}: {res['reason']}")
        if jd["count"] != len(jd["outputs"]):
            failed.append(f"trial {i + 1}: {jd['count']} outputs, Model gives {len(jd['outputs'])}")
        trials.append({"variant": meta["variant"], "outputs": results})
    if len(judged) < len(metas):
        failed.append(f"outputs of {len(judged)} of {len(metas)} trials")
    against = "float64 Model" if all(m["float64"] for m in metas) else "eager Model (no float64 truth)"
    if failed:
        return check("correctness", False, "; ".join(failed[:4])), trials, worst
    return (check("correctness", True, f"matches {against} on {len(judged)} fresh inputs "
                  f"({', '.join(m['variant'] for m in metas)})"), trials, worst)


def result_caching(judged: list, metas: list) -> dict:
    """Trials after the first refill the first trial's input buffers in place: an output that
    does not follow the new values (the previous call's result again) is a cached result."""
    if len(judged) < 2:
        return check("result_caching", None, "fewer than two calls to compare")
    for i in range(1, len(judged)):
        now = [o["fingerprint"] for o in judged[i]["outputs"]]
        before = [o["fingerprint"] for o in judged[i - 1]["outputs"]]
        inputs_differ = metas[i]["inputs_fingerprint"] != metas[i - 1]["inputs_fingerprint"]
        if inputs_differ and any(f is not None for f in now) and now == before \
                and not all(o["compare"]["ok"] for o in judged[i]["outputs"]):
            return check("result_caching", False, f"trial {i + 1} refilled trial {i}'s input buffers with new "
                         "values and got trial {i}'s result back: the output was cached".replace("{i}", str(i)))
    return check("result_caching", True, f"calls {', '.join(str(i + 1) for i in range(1, len(judged)))} reused the "
                 "first call's input buffers, refilled in place: the outputs followed the new values")


def _constant_output(metas: list, j: int) -> float | None:
    """The value output j holds exactly, everywhere, on every input variant, or None."""
    values = {(m.get("constant") or [None] * (j + 1))[j] for m in metas}
    (value,) = values if len(values) == 1 else (None,)
    return value


def _rounding_zero(metas: list, j: int) -> bool:
    """Output j's truth is 0 on every input variant, eager's values its rounding (numeric.rounding_zero)."""
    return bool(metas) and all((m.get("rounding_zero") or [False] * (j + 1))[j] for m in metas)


def tolerance_discriminates(metas: list) -> dict:
    """The bound must reject zeros, a constant and a copy of an input on these inputs; if one of
    them would pass every trial, the check could accept it and the verdict cannot stand.  An
    output that IS one constant on every input variant (Model's value does not depend on the
    inputs': x - x, a softmax over a dim of size 1) is that constant: returning it is right, so
    only a copy of an input must fail there.  So is an output whose truth is 0 on every variant
    while eager's values are its rounding (the mean of a normalized tensor)."""
    loose, fixed = [], []
    for j, names in enumerate(metas[0]["loose"] if metas else []):
        value = _constant_output(metas, j)
        if value is not None:
            fixed.append(f"output {j} is {value:g} everywhere on every input drawn")
        elif _rounding_zero(metas, j):
            value = 0.0
            fixed.append(f"output {j} is 0 on every input drawn (float64 truth under a thousandth of eager "
                         "PyTorch's own rounding error)")
        for name in names:
            if value is not None and name in ("zeros", "a constant"):
                continue
            if all(name in m["loose"][j] for m in metas):
                loose.append(f"output {j} cannot be told from {name}")
    if loose:
        return check("tolerance_discriminates", False, "the tolerance is too loose for this module: " + "; ".join(loose))
    if fixed:
        return check("tolerance_discriminates", True, "; ".join(fixed) + " (Model's output does not depend on the "
                     "inputs' values): a candidate must return exactly that; a copy of the input fails the tolerance")
    return check("tolerance_discriminates", True, "zeros, a constant and a copy of the input each fail the tolerance")


def precision(judged: list, float64: bool) -> dict:
    if not float64:
        return check("precision", None, "no float64 ground truth to measure precision against")
    seen = False
    for i, jd in enumerate(judged):
        for j, out in enumerate(jd["outputs"]):
            loss = out["precision"]
            if loss is None:
                continue
            seen = True
            if loss["reduced"]:
                return check("precision", False, f"trial {i + 1} output {j}: RMS error {loss['rms_err']:.3g} is "
                             f"{loss['rms_err'] / loss['half_rms_err']:.2f} of fp16 rounding's {loss['half_rms_err']:.3g} "
                             f"(eager PyTorch: {loss['eager_rms_err']:.3g}): computed in reduced precision")
    if not seen:
        return check("precision", None, "no float32 output")
    return check("precision", True, "errors far below fp16 rounding: computed in the task's precision")


def roofline(ours_ms: float | None, nbytes: int, bandwidth_gbs: float, gpu_name: str) -> dict:
    if ours_ms is None:
        return check("roofline", None, "not measured (no GPU: interpreter times mean nothing)")
    floor = numeric.roofline_floor_ms(nbytes, bandwidth_gbs)
    if ours_ms < ROOFLINE_SLACK * floor:
        return check("roofline", False, f"{ours_ms * 1e3:.2f} us is faster than moving its {nbytes} bytes of inputs "
                     f"and outputs at {bandwidth_gbs:g} GB/s on {gpu_name} allows ({floor * 1e3:.2f} us): "
                     "the timing does not see all the work")
    return check("roofline", True, f"{ours_ms * 1e3:.2f} us, within the memory roofline ({floor * 1e3:.2f} us for {nbytes} bytes)")


def timed_output(timed: dict | None) -> dict:
    if timed is None:
        return check("timed_output", None, "not timed (no GPU)")
    bad = [f"output {j}: {o['compare']['reason']}" for j, o in enumerate(timed["outputs"]) if not o["compare"]["ok"]]
    if bad or timed["count"] != len(timed["outputs"]):
        return check("timed_output", False, "the output of the timed calls is wrong: " + "; ".join(bad or ["output count"]))
    return check("timed_output", True, "the timed calls compute the right output too")
