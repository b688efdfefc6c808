"""Check a written ModelNew against Model, whole module, on fresh random inputs.  Runs ONLY in a
sandboxed child (worker job "module_check"): the file holds the user's code.

Each trial seeds torch from an unpredictable seed, builds Model(*get_init_inputs()), builds
ModelNew the same way and loads Model's state_dict into it (strict: same parameters and
buffers), draws get_inputs(), and runs both.  A Model that is random (two runs on the same
inputs differ: dropout in training mode) is compared in eval mode; one random even there cannot
be compared and the check is skipped.  Ground truth is Model run in float64; ModelNew
passes when, on every output, its error against that is within the dtype's tolerance of the
output's magnitude plus a few times eager PyTorch's own error (a whole module accumulates
rounding that no single kernel check sees).

Off the GPU the kernels run in Triton's interpreter, which is slow; inputs above `max_elems`
elements are cut along their first (batch) dim, and only if Model accepts the smaller batch
(if it raises, the check is skipped and says why).
"""
from __future__ import annotations

import copy
import os

from mtmc.tools.correctness import RTOL

EAGER_ERROR_FACTOR = 4.0     # ModelNew may be this many times worse than eager PyTorch, plus RTOL
EAGER_ERROR_LIMIT = 0.05     # ... as long as eager is this close (relative) to the float64 run
DEFAULT_MAX_ELEMS = 1 << 20  # per input tensor, interpreter runs only


def _leaves(out) -> list:
    """The tensors of a forward's output, in order (tuples, lists and dicts walked)."""
    import torch
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for x in out for t in _leaves(x)]
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in _leaves(out[k])]
    return []


def _to(x, device=None, dtype=None):
    import torch
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=dtype if dtype is not None and x.is_floating_point() else None)
    if isinstance(x, (tuple, list)):
        return type(x)(_to(v, device, dtype) for v in x)
    return x


def shrink(inputs: list, max_elems: int) -> tuple[list, bool]:
    """Inputs cut along dim 0 so that none has more than max_elems elements."""
    import torch
    big = [x for x in inputs if isinstance(x, torch.Tensor) and x.numel() > max_elems and x.dim() > 0]
    if not big:
        return inputs, False
    rows = min(max(1, x.shape[0] * max_elems // x.numel()) for x in big)
    return [x[:rows].clone() if isinstance(x, torch.Tensor) and x.dim() > 0 else x for x in inputs], True


def compare(ours, eager, ref) -> dict:
    """One output: ModelNew's against the float64 reference (or against eager when there is none)."""
    import torch
    info = {"shape": list(eager.shape), "dtype": str(eager.dtype).removeprefix("torch.")}
    if ours.shape != eager.shape or ours.dtype != eager.dtype:
        return {**info, "ok": False, "reason": f"ModelNew gives {ours.dtype} {tuple(ours.shape)}, Model "
                f"{eager.dtype} {tuple(eager.shape)}"}
    if not eager.is_floating_point():
        same = bool(torch.equal(ours.cpu(), eager.cpu()))
        return {**info, "ok": same, "reason": "equal" if same else "integer outputs differ"}
    o, e = ours.detach().double().cpu(), eager.detach().double().cpu()
    r = ref.detach().double().cpu() if ref is not None else e
    finite = torch.isfinite(r)
    if not torch.equal(torch.isfinite(o), finite) or not torch.equal(o[~finite].nan_to_num(), r[~finite].nan_to_num()):
        return {**info, "ok": False, "reason": "NaN or infinity where the reference has none (or the reverse)"}
    o, e, r = o[finite], e[finite], r[finite]
    if r.numel() == 0:
        return {**info, "ok": True, "reason": "no finite values", "max_abs_err": 0.0, "eager_max_abs_err": 0.0}
    err, eager_err = (o - r).abs(), (e - r).abs()
    rtol = RTOL.get(info["dtype"], RTOL["float32"])
    scale = float(r.pow(2).mean().sqrt())
    if ref is not None and float(eager_err.max()) > EAGER_ERROR_LIMIT * (float(r.abs().max()) + scale):
        return {**info, "ok": False, "max_abs_err": float(err.max()), "eager_max_abs_err": float(eager_err.max()),
                "reason": f"Model itself disagrees with its float64 run (max abs err {float(eager_err.max()):.3g}); "
                          "it is ill-conditioned or depends on state"}
    slack = EAGER_ERROR_FACTOR * float(eager_err.max()) if ref is not None else 0.0
    bound = rtol * (r.abs() + scale) + slack
    bad = int((err > bound).sum())
    res = {**info, "max_abs_err": float(err.max()), "eager_max_abs_err": float(eager_err.max()),
           "ok": bad == 0}
    res["reason"] = ("within tolerance" if bad == 0 else
                     f"{bad} of {err.numel()} elements outside tolerance (max abs err {float(err.max()):.3g}, "
                     f"eager's {float(eager_err.max()):.3g})")
    return res


def _float64_reference(model, inputs):
    """Model's output in float64 on the CPU, or None when the module cannot run in float64."""
    import torch
    try:
        m64 = copy.deepcopy(model).to("cpu", torch.float64)
        with torch.no_grad():
            return _leaves(m64(*_to(inputs, "cpu", torch.float64)))
    except Exception:
        return None


def _same_twice(model, inputs) -> bool:
    """Whether Model gives the same outputs twice on the same inputs (no dropout, no noise)."""
    import torch
    with torch.no_grad():
        a, b = _leaves(model(*inputs)), _leaves(model(*inputs))
    return all(torch.equal(x, y) for x, y in zip(a, b))


def _trial(module, device: str, max_elems: int | None) -> dict:
    """One comparison on fresh weights and inputs (see the module doc)."""
    import torch
    torch.manual_seed(int.from_bytes(os.urandom(6), "little"))
    init = list(module.get_init_inputs())
    model, new = module.Model(*init), module.ModelNew(*init)
    try:
        new.load_state_dict(model.state_dict(), strict=True)
    except RuntimeError as e:
        return {"status": "failed", "reason": f"Model's state_dict does not load into ModelNew: {e}"}
    inputs, scaled = list(module.get_inputs()), False
    if max_elems:
        inputs, scaled = shrink(inputs, max_elems)
        if scaled:
            try:
                with torch.no_grad():
                    model(*inputs)
            except Exception as e:
                return {"status": "skipped", "reason": "the inputs are too large for Triton's interpreter and "
                        f"Model rejects a smaller batch ({type(e).__name__}: {str(e)[:200]})"}
    model.to(device)
    new.to(device)
    dev_inputs = _to(inputs, device)
    mode = ""
    if not _same_twice(model, dev_inputs):
        model.eval()
        new.eval()
        if not _same_twice(model, dev_inputs):
            return {"status": "skipped", "reason": "Model gives different outputs on the same inputs (random "
                    "ops), so the whole module cannot be compared; each group's kernel was checked on its own"}
        mode = " in eval mode (Model is random in training mode: dropout?)"
    with torch.no_grad():
        eager, ours = _leaves(model(*dev_inputs)), _leaves(new(*dev_inputs))
    if len(ours) != len(eager):
        return {"status": "failed", "reason": f"ModelNew returns {len(ours)} tensors, Model {len(eager)}"}
    ref = _float64_reference(model, inputs)
    outputs = [compare(o, e, r if ref else None) for o, e, r in zip(ours, eager, ref or eager)]
    shapes = [list(x.shape) if isinstance(x, torch.Tensor) else repr(x) for x in inputs]
    result = {"outputs": outputs, "input_shapes": shapes, "scaled_down": scaled, "device": device,
              "mode": mode, "against": "a float64 run of Model" if ref else "Model (it cannot run in float64)"}
    bad = [o for o in outputs if not o["ok"]]
    if bad:
        return {**result, "status": "failed",
                "reason": f"output {outputs.index(bad[0])} differs from Model{mode}: {bad[0]['reason']}"}
    return {**result, "status": "passed"}


def check_file(path: str, device: str = "cpu", trials: int = 2, max_elems: int | None = None) -> dict:
    from mtmc.kernels.loader import load_file
    module = load_file(path, f"mtmc_new_{os.getpid()}")
    if max_elems is None and device == "cpu":
        max_elems = DEFAULT_MAX_ELEMS
    for trial in range(trials):
        result = _trial(module, device, max_elems)
        if result["status"] != "passed":
            return {**result, "trials": trial + 1}
    worst = max((o.get("max_abs_err", 0.0) for o in result["outputs"]), default=0.0)
    return {**result, "trials": trials,
            "reason": f"matches {result['against']}{result['mode']} on {trials} fresh random inputs "
                      f"(max abs err {worst:.3g})"}


def check_job(job: dict) -> dict:
    """Worker handler: {"kind": "module_check", "path", "device", "trials", "max_elems"}."""
    from mtmc.tools.offline import block_network
    block_network()
    return check_file(job["path"], job.get("device", "cpu"), int(job.get("trials", 2)), job.get("max_elems"))
