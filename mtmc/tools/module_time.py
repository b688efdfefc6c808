"""End-to-end speed of a written ModelNew on the GPU: against Model in eager PyTorch and under
torch.compile, on the same get_inputs(), each the median of triton.testing.do_bench (CUDA
events, L2 flushed).  Runs ONLY in a sandboxed child (worker job "module_time")."""
from __future__ import annotations

import os


def time_file(path: str) -> dict:
    import torch

    from mtmc.kernels.loader import load_file
    from mtmc.tools.timing import bench_ms
    if not torch.cuda.is_available():
        raise RuntimeError("module timing needs a CUDA GPU")
    module = load_file(path, f"mtmc_new_{os.getpid()}")
    init = list(module.get_init_inputs())
    model = module.Model(*init).cuda()
    new = module.ModelNew(*init).cuda()
    new.load_state_dict(model.state_dict())
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]
    result = {"measured": True, "device": torch.cuda.get_device_name(0),
              "label": "measured: median of triton.testing.do_bench, L2 flushed"}
    with torch.no_grad():
        new(*inputs)  # first call compiles the kernels, outside the timed region
        result["eager_ms"] = bench_ms(lambda: model(*inputs))
        result["ours_ms"] = bench_ms(lambda: new(*inputs))
        try:
            compiled = torch.compile(model)
            compiled(*inputs)
            torch.cuda.synchronize()
            result["compiled_ms"] = bench_ms(lambda: compiled(*inputs))
            result["compiled_note"] = "torch.compile (default mode)"
        except Exception as e:  # a fact about the baseline, not about ModelNew
            result["compiled_ms"] = None
            result["compiled_note"] = f"compile failed: {type(e).__name__}: {str(e)[:300]}"
    result["speedup_vs_eager"] = result["eager_ms"] / result["ours_ms"]
    result["speedup_vs_compiled"] = (result["compiled_ms"] / result["ours_ms"]) if result["compiled_ms"] else None
    return result


def time_job(job: dict) -> dict:
    """Worker handler: {"kind": "module_time", "path", "device": "cuda"}."""
    from mtmc.tools.offline import block_network
    block_network()
    return time_file(job["path"])
