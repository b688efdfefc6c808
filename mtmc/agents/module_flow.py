"""The module flow (DESIGN.md, "Data flow"): an uploaded module as a LangGraph graph, run by
`mtmc optimize`, the chat and the benchmarks through `optimize_module` (`plan_module`: capture and
plan only, `mtmc optimize --plan-only`).

  capture -> rewrite -> plan -+-> Send: group (one per distinct fusion group, the kernel graph as its
                   |          subgraph; independent groups run side by side) -+-> regroup -+-> assemble -> check
                   +-> (no group) ------------------------------------------+   (Send: new |     -> time -> report
                                                                          groups) -> group -+
  capture --(rejected)--> END

- **capture**: the upload's file checks, then torch.fx on fake tensors in a sandboxed child
  (module_steps.capture_checked); too big or broken: status "rejected".
- **rewrite** (the graph stage's algebraic rewrites, module.graph_stage): reductions moved before
  linear maps, eval BatchNorm folded, identities removed; each a recorded decision with its
  legality reason and predicted gain, applied where the gain is above zero.
- **plan** (the graph stage): the (rewritten) graph split into fusion groups the catalog serves and
  ops left to PyTorch (module.fusion).
- **group**: the kernel graph (agents.graph) on the group's spec, invoked inside the node: it is
  checkpointed under the module run's thread, in the group task's own namespace.  Groups of one
  spec run once; the others copy the outcome (`same_as`).
- **regroup**: a conv or matmul group whose kernel lost to PyTorch keeps its anchor in cuDNN /
  cuBLAS, and the ops that followed it are planned again as groups of their own (run once more).
- **assemble** ModelNew with every kernel; **check** it against Model with the guard (groups
  that break it fall back, ModelNew is written again); **time** it on a GPU; **report**.

The state is plain data (the checkpointer keeps it); events are mtmc.agents.events dataclasses sent on
the custom stream, a group's kernel events tagged with its id.
"""
from __future__ import annotations

import dataclasses
import os
import time
import uuid
from pathlib import Path
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Send

from mtmc.agents import events as E
from mtmc.agents import module_steps as steps
from mtmc.agents.context import Context
# the steps' names that callers and tests reach through the flow
from mtmc.agents.module_steps import (  # noqa: F401
    CAPTURE_TIMEOUT_S, Rejected, assemble_checked, capture_in_child, check_in_child, check_syntax, reference_run,
)
from mtmc.module.report import markdown_report, summary_json
from mtmc.agents.runner import FRESH_RUN, stream_run
from mtmc.agents.stream import emit
from mtmc.kernels.catalog import describe
from mtmc.kernels.estimate import roofline
from mtmc.kernels.spec import CUSTOM_FAMILY, KernelSpec, tf32_applies
from mtmc.module import graph_stage
from mtmc.module.graph_stage import layout
from mtmc.module.graph_stage.edit import draws_random
from mtmc.module.graph_stage import library as library_anchor
from mtmc.module.custom_groups import custom_groups
from mtmc.module.fusion import LIBRARY_FAMILIES, Group, Partition, partition
from mtmc.tools.hardware import resolve

# A module's time budget (Context.budget_s) keeps this much, at least, for assemble, check and time.
FINISH_RESERVE_S = 30.0
FINISH_RESERVE_SHARE = 0.2
MAX_CONCURRENT_GROUPS = 4   # groups whose loops run at once: the GPU times one draft at a time (tools.warm)


def _merge(old: dict | None, new: dict | None) -> dict:
    return {**(old or {}), **(new or {})}


class ModuleState(TypedDict, total=False):
    path: str                          # the upload
    out_path: str                      # where ModelNew is written
    report_path: str | None
    capture_timeout_s: float
    memory_mb: int | None
    gpu: bool
    status: str                        # running | rejected | done | failed
    message: str
    captured: dict                     # module.capture's result (shapes, graphs as JSON), its graphs as
                                       # the graph stage rewrote them
    original_graphs: list | None       # the graphs as captured, when the graph stage rewrote any
    rewrites: dict                     # the graph stage's records: applied, refused, decisions
    memory: dict                       # bytes of inputs, parameters, outputs; the GPU's free bytes
    groups: list[dict]                 # module.fusion.Group.to_dict() of each group
    torch_ops: list[dict]
    # group id (as text) -> outcome: a kernel, or why the group stays PyTorch; each group's
    # task adds its own, side by side
    outcomes: Annotated[dict, _merge]
    library: list[dict]                # groups whose anchor regroup left to cuDNN / cuBLAS: graph, group,
                                       # ops, why ([] once regroup found none; unset before it ran)
    check: dict                        # the whole-module check
    timing: dict | None                # ModelNew against eager and torch.compile (GPU)
    replay: dict                       # the launch-overhead action's decision (module.graph_replay)
    deadline: float | None             # time.time() of the module's time budget's end (Context.budget_s)
    summary: dict                      # module.report.summary_json, with "report" and "message"


class GroupTask(TypedDict):
    group: dict
    gpu: bool
    deadline: float | None             # time.time() of the module's time budget's end (None: no budget)


# -- nodes ------------------------------------------------------------------------------------

def capture(state: ModuleState, runtime: Runtime[Context]) -> dict:
    try:
        captured, memory = steps.capture_checked(state["path"], state["gpu"], state["capture_timeout_s"],
                                                state.get("memory_mb"))
    except steps.Rejected as e:
        emit(E.Rejected(message=str(e)))
        return {"status": "rejected", "message": str(e)}
    emit(E.Captured(graphs=[g["path"] for g in captured["graphs"]], problems=captured["problems"]))
    return {"captured": captured, "memory": memory}


def rewrite(state: ModuleState) -> dict:
    """The graph stage's algebraic rewrites (module.graph_stage): each a recorded macro action with
    its legality reason and predicted effect; the rewritten graphs replace the captured ones for
    the plan, and the captured ones are kept for the fallback (a ModelNew that fails the guard)."""
    stage = graph_stage.run(state["captured"])
    rewrites = {k: stage[k] for k in ("applied", "refused", "decisions", "hardware")}
    emit(E.Rewritten(applied=[_rewrite_line(a) for a in stage["applied"]],
                     refused=[_rewrite_line(r) for r in stage["refused"]]))
    out = {"rewrites": rewrites}
    if stage["applied"]:
        out.update(captured=stage["captured"], original_graphs=state["captured"]["graphs"])
    return out


def _rewrite_line(r: dict) -> dict:
    pred = r.get("predicted") or {}
    return {"rule": r["rule"], "node": r["node"], "graph": r["graph"], "ops": r["ops"], "result": r.get("result", ""),
            "reason": r.get("why_not") or r["reason"], "predicted_gain_ms": pred.get("gain_ms")}


def plan(state: ModuleState, runtime: Runtime[Context]) -> dict:
    part = partition(state["captured"])
    if runtime.context.llm is not None:   # the coder role writes what the catalog does not serve
        part = _with_custom_groups(part, custom_groups(state["captured"], part,
                                                       max((g.id for g in part.groups), default=-1) + 1))
    emit(E.Partitioned(groups=[{"id": g.id, "ops": g.ops, "family": g.family} for g in part.groups],
                       torch_ops=part.torch_ops))
    return {"groups": [g.to_dict() for g in part.groups], "torch_ops": part.torch_ops}


def _with_custom_groups(part: Partition, custom: list[Group]) -> Partition:
    """`part` with the custom groups (module.custom_groups) in place of the ops they take over."""
    mine = {(g.graph, n) for g in custom for n in g.nodes}
    return Partition(part.groups + custom, [t for t in part.torch_ops if (t["graph"], t["node"]) not in mine])


def _spec_key(g: dict) -> str:
    return KernelSpec.from_dict(g["spec"]).key()


def _ideal_ms(g: dict, hw) -> float:
    """The roofline's least time for a group's spec on `hw` (0 where the model has none, e.g. custom ops)."""
    try:
        return float(roofline(KernelSpec.from_dict(g["spec"]), hw)["ideal_ms"])
    except Exception:   # noqa: BLE001 - an order hint only; a spec the model cannot cost goes last
        return 0.0


def _fan_out(state: ModuleState, then: str) -> list[Send] | str:
    """One group task per distinct spec not run yet (the first group that has it), or `then`.
    The costliest specs (roofline time x how many groups share it) go first: a module of a hundred
    groups (a level-3 CNN) spends its time budget where the time is, and what the budget leaves
    unstarted is the cheap rest."""
    first: dict[str, dict] = {}
    count: dict[str, int] = {}
    for g in state.get("groups") or []:
        key = _spec_key(g)
        first.setdefault(key, g)
        count[key] = count.get(key, 0) + 1
    ran = state.get("outcomes") or {}
    todo = [(k, g) for k, g in first.items() if str(g["id"]) not in ran]
    if not todo:
        return then
    hw = resolve("auto")
    todo.sort(key=lambda kg: -_ideal_ms(kg[1], hw) * count[kg[0]])
    return [Send("group", GroupTask(group=g, gpu=state["gpu"], deadline=state.get("deadline"))) for _, g in todo]


def fan_out(state: ModuleState) -> list[Send] | str:
    return _fan_out(state, "regroup")


def fan_out_regrouped(state: ModuleState) -> list[Send] | str:
    return _fan_out(state, "assemble")


def kernel_graph():
    """The kernel graph a group runs (no checkpointer of its own: it inherits the module run's)."""
    from mtmc.agents.graph import compile_graph
    return compile_graph()


def _moves_end(deadline: float | None, budget_s: float | None) -> float | None:
    """When groups stop starting and planners stop moving: the budget's end less what assembling,
    the module check and the timing still need (the check takes up to ~30 s at KernelBench size)."""
    if deadline is None or not budget_s:
        return None
    return deadline - max(FINISH_RESERVE_S, FINISH_RESERVE_SHARE * budget_s)


def group(task: GroupTask, runtime: Runtime[Context]) -> dict:
    """The kernel graph on one group's spec; its events go out tagged with the group's id."""
    from mtmc.agents.graph import recursion_limit
    g = Group.from_dict(task["group"])
    spec = KernelSpec.from_dict(g.spec)
    emit(E.GroupStart(group=g.id, ops=g.ops, description=describe(spec)))
    stop_at = _moves_end(task.get("deadline"), runtime.context.budget_s)
    if stop_at is not None and time.time() >= stop_at:
        reason = (f"not optimized: the module's time budget ({runtime.context.budget_s:g} s) was spent before this "
                  "group's turn; the rest is kept for the module check")
        emit(E.GroupDone(group=g.id, status="fallback", reason=reason))
        return {"outcomes": {str(g.id): {"status": "fallback", "reason": reason}}}
    if g.family == CUSTOM_FAMILY:
        return {"outcomes": {str(g.id): _custom_outcome(g, spec, task["gpu"], runtime.context)}}
    # torch.compile is compared once for the whole module (module_time), not per group
    ctx = dataclasses.replace(runtime.context, out_path=None, compile_baseline=False, deadline=stop_at)
    inputs = {"request": spec.request, "spec": tf32_allowed(g.spec, runtime.context.allow_tf32), "initial_config": None,
              **FRESH_RUN}
    final: dict = {}
    for mode, chunk in kernel_graph().stream(inputs, config={"recursion_limit": recursion_limit(ctx)}, context=ctx,
                                             stream_mode=["custom", "values"]):
        if mode == "custom":
            emit(E.from_dict(chunk).in_group(g.id))
        else:
            final = chunk
    outcome = steps.outcome_from_state(final, task["gpu"])
    emit(E.GroupDone(group=g.id, status=outcome["status"], reason=outcome["reason"]))
    return {"outcomes": {str(g.id): outcome}}


def tf32_allowed(spec: dict, allowed: bool) -> dict:
    """The group's spec with allow_tf32 set where the user allowed TF32 and the group is an fp32
    conv or matmul (their kernels then default to one TF32 product per product)."""
    if not allowed or not tf32_applies(spec.get("family"), spec.get("dtype")):
        return spec
    return {**spec, "params": {**(spec.get("params") or {}), "allow_tf32": True}}


def regroup(state: ModuleState, runtime: Runtime[Context] | None = None) -> dict:
    """A conv or matmul group whose kernel lost to PyTorch (or never passed) keeps its anchor in
    PyTorch's library kernel (cuDNN, cuBLAS) and gives up its tail: the plan is made again with
    those anchors pinned, so the pointwise chain (or norm, reduction) that followed becomes a group
    of its own, one pass instead of PyTorch's one per op (what torch.compile does around an
    extern conv).  A conv group whose kernel won goes the same way where cuDNN's conv plus its tail
    fused on its own is predicted faster (graph_stage.library).  Once per run: the second pass's
    groups are not split again."""
    if state.get("library") is not None:
        return {}
    outcomes, before = _outcomes_by_id(state), _groups(state)
    pins: dict[str, dict[str, str]] = {}
    library, changed = [], {}   # changed: outcomes the library decision touched
    for g in before:
        o = outcomes.get(g.id, {})
        if g.family not in LIBRARY_FAMILIES or len(g.ops) < 2:
            continue
        if o.get("status") == "fallback":
            why = (f"kept in PyTorch's library kernel (group {g.id}: {o.get('reason', 'no kernel')}); "
                   "what followed it is fused on its own")
        else:
            decided = _library_pays(state, g, o, pins, runtime.context.target if runtime else "auto")
            if decided is None:
                continue
            pays, why = decided
            outcomes[g.id] = {**o, "library_decision": why}
            changed[str(g.id)] = outcomes[g.id]
            if not pays:
                continue
            outcomes[g.id].update(status="fallback", reason=why)
            emit(E.GroupFallback(group=g.id, reason=why))
        pins.setdefault(g.graph, {}).update({n: why for n in g.nodes})
        library.append({"graph": g.graph, "group": g.id, "ops": g.ops, "why": why})
    if not pins:
        return {"library": [], "outcomes": changed}
    out = _library_layout(state, [g for g in before if g.id in {x["group"] for x in library}])
    captured = out.get("captured", state["captured"])
    # the second plan keeps the custom groups already made (and run), with their ids
    part = _with_custom_groups(partition(captured, library=pins),
                               [g for g in before if g.family == CUSTOM_FAMILY])
    old = {(g.graph, tuple(g.nodes)): g for g in before}
    next_id = max(g.id for g in old.values()) + 1
    groups = []
    for g in part.groups:   # unchanged groups keep their id and outcome; new ones get fresh ids
        same = old.get((g.graph, tuple(g.nodes)))
        if same is None:
            g, next_id = dataclasses.replace(g, id=next_id), next_id + 1
        groups.append(same or g)
    emit(E.Partitioned(groups=[{"id": g.id, "ops": g.ops, "family": g.family} for g in groups],
                       torch_ops=part.torch_ops))
    return {**out, "groups": [g.to_dict() for g in groups], "torch_ops": part.torch_ops, "library": library,
            "outcomes": changed}


def _library_pays(state: ModuleState, g: Group, o: dict, pins: dict, target: str) -> tuple[bool, str] | None:
    """Whether a conv group whose kernel won against eager goes to cuDNN with its tail fused on
    its own (graph_stage.library), and why; None where the question does not arise: off a GPU,
    the group unmeasured, a conv the layout probe cannot time, a tail the catalog does not serve
    whole."""
    if not (state.get("gpu") and o.get("status") == "kernel" and o.get("measured") and o.get("time_ms")):
        return None
    desc = next(d for d in state["captured"]["graphs"] if d.get("path", "") == g.graph)
    conv = layout.conv_of(desc, g.nodes)
    if conv is None:
        return None
    measured = steps.measure_layout(desc, conv)
    if "nchw_ms" not in measured:
        return None
    trial = partition(state["captured"], library={**pins, g.graph: {**pins.get(g.graph, {}), conv: "trial"}})
    tail = [t for t in trial.groups if t.graph == g.graph and set(t.nodes) <= set(g.nodes)]
    if {n for t in tail for n in t.nodes} != set(g.nodes) - {conv}:
        return None   # part of the tail would be left to PyTorch: not this decision's case
    est = library_anchor.tail_ms([KernelSpec.from_dict(t.spec) for t in tail], resolve(target))
    if est is None:
        return None
    return library_anchor.judge(o["time_ms"], measured["nchw_ms"], est)


def _library_layout(state: ModuleState, kept: list[Group]) -> dict:
    """On a GPU, each conv left to cuDNN runs channels-last with its pointwise tail reading that
    layout where that is legal (graph_stage.layout) and, measured on this GPU, faster at the same
    precision (tools.layout_probe, layout.judge); recorded with the
    graph stage's rewrites, applied or refused with the reason.  The state's update: captured
    (and original_graphs, for the guard's fallback) when a graph changed, rewrites."""
    if not state.get("gpu"):
        return {}
    graphs = {d.get("path", ""): d for d in state["captured"]["graphs"]}
    applied, refused = [], []
    for g in kept:
        conv = layout.conv_of(graphs[g.graph], g.nodes)
        if conv is None:
            continue
        c = layout.channels_last(graphs[g.graph], conv)
        if not c.legal:
            refused.append({**c.to_dict(), "status": "refused"})
            continue
        measured = steps.measure_layout(graphs[g.graph], conv)   # a macro action decided by measurement
        pays, why = layout.judge(measured)
        record = {**c.to_dict(), "measured": measured}
        if pays:
            graphs[g.graph] = {**c.apply, "rewritten": True}
            applied.append({**record, "status": "applied", "reason": why})
        else:
            refused.append({**record, "status": "refused", "legal": False, "reason": why})
    if not (applied or refused):
        return {}
    emit(E.Rewritten(applied=[_rewrite_line(a) for a in applied], refused=[_rewrite_line(r) for r in refused]))
    rewrites = state.get("rewrites") or {"applied": [], "refused": [], "decisions": []}
    out = {"rewrites": {**rewrites, "applied": [*rewrites.get("applied", []), *applied],
                        "refused": [*rewrites.get("refused", []), *refused]}}
    if applied:
        out["captured"] = {**state["captured"], "graphs": [graphs[d.get("path", "")] for d in state["captured"]["graphs"]]}
        out["original_graphs"] = state.get("original_graphs") or state["captured"]["graphs"]
    return out


def _custom_outcome(g: Group, spec: KernelSpec, gpu: bool, ctx: Context) -> dict:
    """The coder role's kernel for a custom group: the model's drafts, each accepted or refused by
    the guard against the group's PyTorch reference (agents.llm_coder); never raises."""
    from mtmc.agents.llm_coder import write_kernel
    from mtmc.request.llm_parse import CustomOp
    op = CustomOp(spec.op, spec.params["reference"], spec.params["inputs"])
    calls: list = []
    result = write_kernel(op, ctx.llm, calls, target=None if ctx.target == "auto" else ctx.target,
                          device="cuda" if gpu else "cpu", timeout_s=ctx.timeout_s,
                          on_step=lambda r: emit(E.build("custom_step", **r).in_group(g.id)))
    if result.source is None:
        outcome = {"status": "fallback", "reason": result.message}
    else:
        outcome = {"status": "kernel", "source": result.source, "config": {}, "step": len(result.steps) - 1,
                   "correctness": {"reason": "accepted by the guard against the group's PyTorch reference"},
                   "time_ms": None, "measured": False, "reason": result.message}
    emit(E.GroupDone(group=g.id, status=outcome["status"], reason=outcome["reason"]))
    return {**outcome, "llm_calls": calls}


def _groups(state: ModuleState) -> list[Group]:
    return [Group.from_dict(g) for g in state.get("groups") or []]


def _outcomes_by_id(state: ModuleState) -> dict[int, dict]:
    """Every group's outcome (copied from the group that ran its spec), keyed by group id."""
    ran = {int(k): v for k, v in (state.get("outcomes") or {}).items()}
    first: dict[str, int] = {}
    out = {}
    for g in state.get("groups") or []:
        gid = first.setdefault(_spec_key(g), g["id"])
        out[g["id"]] = dict(ran[gid]) if gid == g["id"] else {**ran[gid], "same_as": gid}
    return out


def assemble(state: ModuleState) -> dict:
    """ModelNew with every group's kernel, written to out_path."""
    outcomes = _outcomes_by_id(state)
    steps.write_model_new(Path(state["path"]).read_text(), state["captured"], _groups(state), outcomes,
                         Path(state["out_path"]))
    return {"outcomes": {str(k): v for k, v in outcomes.items()}}


def check(state: ModuleState, runtime: Runtime[Context]) -> dict:
    """The whole-module check by the guard; groups that break it fall back (ModelNew rewritten)."""
    outcomes = _outcomes_by_id(state)
    original = {**state["captured"], "graphs": state["original_graphs"]} if state.get("original_graphs") else None
    result = steps.assemble_checked(state["path"], state["captured"], _groups(state), outcomes,
                                   Path(state["out_path"]), state["gpu"], runtime.context.timeout_s,
                                   on_event=lambda ev: emit(E.from_dict(ev)), original=original,
                                   deadline=_moves_end(state.get("deadline"), runtime.context.budget_s),
                                   tf32=runtime.context.allow_tf32)
    out = {"check": result, "outcomes": {str(k): v for k, v in outcomes.items()}}
    if result.get("rewrites_reverted"):   # ModelNew was written from the graph as captured
        rewrites = dict(state.get("rewrites") or {})
        rewrites["applied"] = [{**a, "status": "reverted", "why_not": result["rewrites_reverted"]}
                               for a in rewrites.get("applied", [])]
        out["rewrites"] = rewrites
    return out


LAUNCH_HOST_MS = 0.005       # what one kernel launch costs the host from Python (torch op or Triton wrapper)
REPLAY_LAUNCH_SHARE = 0.1    # the replay is tried where launches may be this share of the GPU time or more


def _launch_load(state: ModuleState) -> tuple[int, float | None]:
    """(kernel launches of one forward, roughly: groups and ops left to PyTorch; the GPU ms its
    groups measured, kernels or eager, or None when one was not measured)."""
    outs = list(_outcomes_by_id(state).values())
    times = [o.get("time_ms") if o.get("status") == "kernel" else o.get("eager_ms") for o in outs]
    launches = len(outs) + len(state.get("torch_ops") or [])
    return launches, (sum(times) if times and all(times) else None)


def _replay_refusal(state: ModuleState, enabled: bool = True) -> tuple[str, str] | None:
    """(status, why) when the launch-overhead action is not tried or refused; None to try it."""
    chk = state["check"]
    if not enabled:
        return "not tried", ("off unless asked for (optimize --cuda-graph): it has not yet run on a GPU")
    if not state["gpu"]:
        return "not tried", "no GPU: a CUDA graph's gain is measured, not estimated"
    if chk["status"] != "passed" or chk.get("model_own_code") or chk.get("rewrites_reverted"):
        return "not tried", "ModelNew is Model's own code or did not pass the module check"
    if state.get("deadline") and time.time() > state["deadline"] - FINISH_RESERVE_S:
        return "not tried", "the module's time budget is spent"
    random = [n["name"] for d in state["captured"]["graphs"] for n in d["nodes"]
              if draws_random(d.get("modules", {}), n)]
    if random:
        return "refused", (f"the forward draws random numbers ({random[0]}): a replayed graph's draws would not "
                           "follow Model's generator")
    launches, gpu_ms = _launch_load(state)
    if gpu_ms is not None and launches * LAUNCH_HOST_MS < REPLAY_LAUNCH_SHARE * gpu_ms:
        return "not tried", (f"{launches} launches (~{launches * LAUNCH_HOST_MS * 1e3:.0f} us of host time) against "
                             f"{gpu_ms:.3f} ms measured in its groups: launches are not where the time goes")
    size = (state.get("memory") or {}).get("inputs_bytes") or 0
    if size > steps.REPLAY_MAX_BYTES:
        return "refused", (f"inputs of {size / 2**30:.1f} GiB: a graph keeps static copies of them and its own "
                           "intermediates; launches are not where such a module's time goes")
    return None


def replay(state: ModuleState, runtime: Runtime[Context]) -> dict:
    """The launch-overhead macro action: ModelNew's whole forward replayed as one CUDA graph where
    the GPU measures it faster than the plain ModelNew and the guard passes it."""
    refused = _replay_refusal(state, runtime.context.cuda_graph)
    if refused is not None:
        return {"replay": {"action": "cuda_graph", "status": refused[0], "why": refused[1]}}
    decision = steps.replay_choice(state["path"], state["captured"], _groups(state), _outcomes_by_id(state),
                                   Path(state["out_path"]), runtime.context.timeout_s,
                                   on_event=lambda ev: emit(E.from_dict(ev)), tf32=runtime.context.allow_tf32)
    emit(E.Replayed(status=decision["status"], why=decision["why"], plain_ms=decision["plain_ms"],
                    replay_ms=decision["replay_ms"]))
    return {"replay": decision}


def time_it(state: ModuleState, runtime: Runtime[Context]) -> dict:
    """ModelNew against eager and torch.compile, on a GPU and only after it passed the check."""
    if not (state["gpu"] and state["check"]["status"] == "passed"):
        return {"timing": None}
    if state["check"].get("model_own_code"):   # no kernel, no rewrite: 1.00x by construction
        return {"timing": {"measured": False, "error": "not timed: no Triton kernel (ModelNew is Model's own code)"}}
    if not runtime.context.time_module:
        return {"timing": {"measured": False, "error": "not timed: --no-time (the caller times ModelNew)"}}
    timing = steps.time_in_child(state["out_path"], runtime.context.timeout_s)
    emit(E.build("module_time", **timing))
    return {"timing": timing}


def report(state: ModuleState, runtime: Runtime[Context] | None = None) -> dict:
    status = "failed" if state["check"]["status"] == "failed" else "done"
    part = Partition(_groups(state), state.get("torch_ops") or [])
    outcomes = {int(k): v for k, v in state["outcomes"].items()}
    summary = summary_json(os.path.basename(state["path"]), state["out_path"], status, state["captured"], part,
                           outcomes, state["check"], state.get("timing"), state["gpu"], state.get("rewrites"))
    summary["replay"] = state.get("replay")
    summary["tf32"] = bool(runtime and runtime.context.allow_tf32)
    text = markdown_report(summary)
    if state.get("report_path"):
        steps.write_text(Path(state["report_path"]), text)
    summary["report"] = text
    summary["message"] = steps.final_message(summary)
    emit(E.Final(status=status, message=summary["message"]))
    return {"status": status, "message": summary["message"], "summary": summary}


def build_module_graph() -> StateGraph:
    g = StateGraph(ModuleState, context_schema=Context)
    for name, fn in [("capture", capture), ("rewrite", rewrite), ("plan", plan), ("group", group),
                     ("regroup", regroup), ("assemble", assemble), ("check", check), ("replay", replay),
                     ("time", time_it),
                     ("report", report)]:
        g.add_node(name, fn)
    g.add_edge(START, "capture")
    g.add_conditional_edges("capture", lambda s: END if s.get("status") == "rejected" else "rewrite", ["rewrite", END])
    g.add_edge("rewrite", "plan")
    g.add_conditional_edges("plan", fan_out, ["group", "regroup"])
    g.add_edge("group", "regroup")
    g.add_conditional_edges("regroup", fan_out_regrouped, ["group", "assemble"])
    g.add_edge("assemble", "check")
    g.add_edge("check", "replay")
    g.add_edge("replay", "time")
    g.add_edge("time", "report")
    g.add_edge("report", END)
    return g


def run_module(path: str, ctx: Context, out_path: str | None = None, report_path: str | None = None,
               on_event=None, capture_timeout_s: float = CAPTURE_TIMEOUT_S, memory_mb: int | None = None,
               thread_id: str | None = None, saver=None, plan_only: bool = False) -> dict:
    """Run the module graph on the file at `path`, checkpointed under `thread_id` (a new one by
    default) in `saver` (default: the conversations' SQLite checkpointer); the final state.
    plan_only stops after the plan.  Events reach on_event one at a time, in this thread."""
    from mtmc.agents.graph import checkpointer
    from mtmc.tools.hardware import gpu_available
    own = saver is None
    saver = checkpointer() if own else saver
    try:
        graph = build_module_graph().compile(checkpointer=saver, interrupt_after=["plan"] if plan_only else None)
        config = {"configurable": {"thread_id": thread_id or uuid.uuid4().hex},
                  "max_concurrency": MAX_CONCURRENT_GROUPS, "recursion_limit": 50}
        inputs = {"path": path, "out_path": out_path, "report_path": report_path,
                  "capture_timeout_s": capture_timeout_s, "memory_mb": memory_mb, "status": "running",
                  "gpu": gpu_available() if ctx.use_gpu is None else ctx.use_gpu, "outcomes": {},
                  "deadline": time.time() + ctx.budget_s if ctx.budget_s else None}
        return stream_run(graph, inputs, config, ctx, on_event)
    finally:
        if own:
            saver.conn.close()


def optimize_module(path: str, ctx: Context, out_path: str, report_path: str | None = None, on_event=None,
                    capture_timeout_s: float = CAPTURE_TIMEOUT_S, memory_mb: int | None = None,
                    thread_id: str | None = None) -> dict:
    """Optimize the module file at `path`, write ModelNew to out_path (and the markdown report to
    report_path).  Returns the summary (see module.report.summary_json) with "status":
    "done" (ModelNew written and checked), "rejected" (a bad upload; "message" says why) or
    "failed" (ModelNew does not match Model even with every group in PyTorch)."""
    state = run_module(path, ctx, out_path, report_path, on_event, capture_timeout_s, memory_mb, thread_id)
    if state.get("status") == "rejected":
        return {"status": "rejected", "file": os.path.basename(path), "message": state["message"]}
    return state["summary"]


def plan_module(path: str, gpu: bool | None = None, capture_timeout_s: float = CAPTURE_TIMEOUT_S,
                memory_mb: int | None = None, on_event=None) -> dict:
    """Capture and plan only (`mtmc optimize --plan-only`): nothing is compiled, and nothing
    runs at full size.  Returns {"status": "planned" | "rejected", "file", "seconds", and either
    "message" or "tensors" ("fake" | "real"), "inputs", "outputs", "memory", "groups" (id, family,
    ops, spec summary), "torch_ops" (op and why it stays PyTorch), "problems" (untraceable parts)}."""
    from langgraph.checkpoint.memory import InMemorySaver
    start, name = time.monotonic(), os.path.basename(path)
    state = run_module(path, Context(use_gpu=gpu), on_event=on_event, capture_timeout_s=capture_timeout_s,
                       memory_mb=memory_mb, saver=InMemorySaver(), plan_only=True)
    if state.get("status") == "rejected":
        return {"status": "rejected", "file": name, "message": state["message"], "seconds": time.monotonic() - start}
    captured = state["captured"]
    return {"status": "planned", "file": name, "seconds": time.monotonic() - start, "gpu": state["gpu"],
            "tensors": captured.get("tensors"), "fake_failure": captured.get("fake_failure"),
            "inputs": captured["inputs"], "outputs": captured.get("outputs", []), "memory": state["memory"],
            "groups": [steps.group_plan(g) for g in _groups(state)], "torch_ops": state.get("torch_ops") or [],
            "problems": captured["problems"], "rewrites": state.get("rewrites") or {}}
