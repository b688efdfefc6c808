"""Run-time context of one graph run: what it may use, not what it has found."""
from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass
class Context:
    target: str = "auto"          # hardware profile name; "auto" = the present GPU, else H200
    max_steps: int = 8            # planner moves after the first draft
    max_debug: int = 3            # debugger fixes per failing lineage before a roll-back
    patience: int = 3             # measured moves without gain before the planner stops
    timeout_s: float = 240.0      # wall time for one verification in the child process
    use_gpu: bool | None = None   # None: use one when present
    out_path: str | None = None   # where finalize writes the kernel file
    llm: object | None = None     # an optional chat model (mtmc.tools.llm): the parser role (request.llm_parse)
    compile_baseline: bool = True  # also time torch.compile (one compile per run); module groups skip it
    planner: str = "policy"       # "policy" (the learned one) or "baseline"; MTMC_PLANNER overrides it
    time_module: bool = True      # time ModelNew end to end after its check (the benchmark times it itself)
    cuda_graph: bool = False      # try the CUDA-graph replay action (module.graph_replay; optimize --cuda-graph)
    allow_tf32: bool = False      # fp32 conv / matmul groups may use TF32 products (optimize --allow-tf32)
    budget_s: float | None = None  # wall seconds for a whole module (optimize --time-budget; module_flow)
    deadline: float | None = None  # time.time() after which the planner makes no more moves (from budget_s)


def known_target(target: str) -> bool:
    """True for a usable --target; otherwise says why on stderr (the caller exits 2)."""
    from mtmc.tools.hardware import resolve
    try:
        resolve(target)
    except ValueError as exc:
        print(f"mtmc: {exc}", file=sys.stderr)
        return False
    return True


def env_llm(fallback: str):
    """The chat model named by MTMC_LLM_BASE_URL / MTMC_LLM_MODEL, or None (offline); a model that
    cannot be built is said on stderr with what happens instead (`fallback`)."""
    from mtmc.tools.llm import LLMFailure, from_env
    try:
        return from_env()
    except LLMFailure as exc:
        print(f"mtmc: MTMC_LLM_BASE_URL is set but {exc}; {fallback}", file=sys.stderr)
        return None
