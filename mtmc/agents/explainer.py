"""Answer "why" questions about a run from its records: the decision (action, alternatives with
probabilities, reason), the hardware limits that bound it, what was measured or only estimated,
and similar past histories from memory.

Works on a final graph state or on a stored history (HistoryRecord.as_state()).  The records
become a fact sheet in plain text; without an LLM that is the answer.  With one (`llm`, a chat
model from mtmc.tools.llm) the model writes prose from the fact sheet alone, and the answer is
that prose, a warning if it quotes numbers the facts do not hold, then the fact sheet itself so
every claim can be checked.  If the model cannot be used, the answer is the fact sheet with a
one-line note saying why.
"""
from __future__ import annotations

import re

from mtmc.agents.knob_words import glossary_lines, knobs_named
from mtmc.kernels.catalog import describe, family_of
from mtmc.kernels.spec import KernelSpec
from mtmc.memory import MemoryUnavailable, Store
from mtmc.tools.hardware import HardwareProfile, get_profile, resolve
from mtmc.tools.llm import LLMFailure, ask, endpoint, prompt

_STEP = re.compile(r"\bstep\s*#?\s*(\d+)", re.I)
_KNOB = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*=\s*([\w.]+)")
_STOP = re.compile(r"\b(stop|stopped|stopping|finish|finished|end|ended|halt)\b", re.I)
_FUSE = re.compile(r"\bfus(e|ed|ion|ing)\b", re.I)
_ITEM = re.compile(r"^\s*- ")


FACTS_HEAD = "Facts from the run's records (what the answer above was written from):"


def explain(question: str, state: dict, store: Store | None = None, llm=None) -> str:
    """The answer to `question` about the run in `state` (see the module doc)."""
    kind, facts = _facts(question, state, store)
    if llm is None or kind == "none":   # nothing recorded to phrase: the facts say so already
        return facts
    try:
        prose = ask(llm, prompt("explainer"), f"Question: {question}\n\nFacts:\n{facts}")
    except LLMFailure as exc:
        return f"(The LLM at {endpoint(llm)} could not be used: {exc}. The answer below is built from the records only.)\n\n{facts}"
    unknown = unsupported_numbers(prose, facts + "\n" + question)
    warning = (f"\n\nCheck: the text above quotes numbers that are not in the facts below "
               f"({', '.join(unknown[:8])}); trust the facts." if unknown else "")
    return f"{prose}{warning}\n\n---\n{FACTS_HEAD}\n\n{facts}"


def _facts(question: str, state: dict, store: Store | None) -> tuple[str, str]:
    """(what the question is about, the fact sheet in plain text)."""
    kind, target, lines = _subject(question, state)
    if not state.get("spec"):   # an op outside the catalog (agents.custom_op): its steps' records only
        return kind, join_lines(lines + _custom_facts(kind, target, state))
    spec = KernelSpec.from_dict(state["spec"])
    # "what does ROWS_PER_PROG mean?" (a knob, no value or step named): its meaning first, then the facts
    about_knob = not (_KNOB.search(question) or _STEP.search(question))
    own = {*family_of(spec).config_space(spec), "num_warps", "num_stages"}
    glossary = glossary_lines(spec.family, knobs_named(question), own, (state.get("best") or {}).get("config")) \
        if about_knob else []
    if glossary:
        lines = ["What the knobs named do in this family's kernel:", *glossary, *lines]
    hw = _profile(state, target)
    if kind == "step":
        lines += _decision(target)
        lines += _limits(target.get("verdict") or {}, spec, hw)
        lines += _evidence(target.get("verdict") or {})
        lines += _memory_used(target.get("history"))
    elif kind == "stop":
        best = state.get("best") or {}
        lines += _decision(target)
        lines += _limits(best.get("verdict") or {}, spec, hw, what=f"the kept draft (step {best.get('step')})")
        lines += _evidence(best.get("verdict") or {})
    elif kind == "fuse":
        lines += _fusion(spec, state)
    lines += _similar(spec, hw.name, state.get("history_id"), store)
    return kind, join_lines(lines)


def _custom_facts(kind: str, target: dict | None, state: dict) -> list[str]:
    """A custom op's step: the move or fix and why, and the guard's verdict of its draft."""
    if kind not in ("step", "stop") or target is None:
        return []
    lines = _decision(target)
    verdict = target.get("verdict") or ((state.get("best") or {}).get("verdict") if kind == "stop" else None) or {}
    if verdict:
        lines.append(f"Guard: {verdict.get('summary') or verdict.get('kind')}"
                     + ("" if verdict.get("ok") else f": {(verdict.get('detail') or '')[:300]}"))
        lines.append("Measured: " + (f"{verdict['time_ms']:.4f} ms" if verdict.get("measured") else
                                     "no (Triton's interpreter: the guard checks correctness only)"))
    c = state.get("custom") or {}
    lines.append(f"The op: {c.get('name')}, outside the catalog; the model wrote its reference and every draft, "
                 "the planner chose each macro move, the guard checked each draft in a sandboxed child.")
    return lines


def join_lines(lines: list[str]) -> str:
    """The fact sheet's lines as text that also reads right as markdown (the chat renders it):
    a blank line ends each list, so the line after it is not swallowed by its last item."""
    out: list[str] = []
    for line in lines:
        if out and _ITEM.match(out[-1]) and not _ITEM.match(line):
            out.append("")
        out.append(line)
    return "\n".join(out)


# -- checking the prose against the facts -------------------------------------------------------
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)(%?)")
_ANY_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def unsupported_numbers(text: str, facts: str) -> list[str]:
    """Numbers in `text` that no number in `facts` rounds to (at the precision `text` writes
    them; a percentage may also be a fraction in the facts).  Small whole numbers (0-10) are
    let through: prose counts things ("two alternatives") that the facts list one by one."""
    known = [float(x) for x in _ANY_NUMBER.findall(facts)]
    out = []
    for m in _NUMBER.finditer(text):
        raw, pct = m.group(1), m.group(2)
        value = float(raw)
        if "." not in raw and "e" not in raw.lower() and value <= 10:
            continue
        decimals = len(raw.split(".")[1].lower().split("e")[0]) if "." in raw else 0
        tol = 0.5 * 10 ** -decimals + 1e-12
        if "e" in raw.lower():
            tol = abs(value) * 0.05
        hit = any(abs(k - value) <= tol for k in known)
        if pct and not hit:
            hit = any(abs(k * 100 - value) <= tol for k in known)
        if not hit and raw + pct not in out:
            out.append(raw + pct)
    return out


# -- which decision the question is about -------------------------------------------------------
def _subject(question: str, state: dict) -> tuple[str, dict | None, list[str]]:
    steps = state.get("steps") or []
    m = _STEP.search(question)
    if m:
        n = int(m.group(1))
        step = next((s for s in steps if s.get("step") == n), None)
        if step is None:
            return "none", None, [f"There is no step {n}: the run recorded steps "
                                  f"{', '.join(str(s.get('step')) for s in steps) or 'none'}."]
        return "step", step, []
    m = _KNOB.search(question)
    if m:
        knob, value = m.group(1).lower(), m.group(2).lower()
        setter = next((s for s in steps if str((s.get("action") or {}).get("knob")).lower() == knob
                       and str(s["action"].get("value")).lower() == value), None)
        if setter:
            return "step", setter, []
        holder = next((s for s in steps if any(k.lower() == knob and str(v).lower() == value
                                               for k, v in (s.get("config") or {}).items())), None)
        if holder:
            return "step", holder, [f"{m.group(1)}={m.group(2)} was not a move of its own: it came with "
                                    f"step {holder['step']}'s config."]
        weighed = next((s for s in steps if any(a.get("action", "").lower() == f"{knob}={value}"
                                                for a in s.get("alternatives") or [])), None)
        if weighed:
            return "step", weighed, [f"{m.group(1)}={m.group(2)} was weighed but not chosen at step "
                                     f"{weighed['step']}; the choice made there:"]
        return "none", None, [f"No step set or weighed {m.group(1)}={m.group(2)}."]
    if _STOP.search(question):
        decision = state.get("decision") or {}
        if (decision.get("action") or {}).get("kind") == "stop":
            return "stop", decision, ["Why the planner stopped:"]
        return "none", None, ["The planner did not stop on its own: the run ended without a stop decision "
                              "(no correct draft, or the graph was interrupted)."]
    if _FUSE.search(question):
        return "fuse", None, []
    best = state.get("best") or {}
    step = next((s for s in steps if s.get("step") == best.get("step")), steps[-1] if steps else None)
    if step is None:
        return "none", None, ["The run recorded no steps."]
    return "step", step, [f"(No step named; answering for the final draft, step {step['step']}.)"]


def _profile(state: dict, step: dict | None) -> HardwareProfile:
    if state.get("gpu"):  # a stored history carries its profile
        return HardwareProfile(**state["gpu"])
    for draft in (step, state.get("best")):
        name = (((draft or {}).get("verdict") or {}).get("resources") or {}).get("target")
        if name:
            try:
                return get_profile(name)
            except ValueError:
                break
    return resolve(None)


# -- the parts of an answer ---------------------------------------------------------------------
def _label(action: dict) -> str:
    if action.get("kind") == "init":
        return "the first draft"
    return "stop" if action.get("kind") == "stop" else f"{action.get('knob')}={action.get('value')}"


def _decision(d: dict) -> list[str]:
    head = f"Step {d['step']}: " if "step" in d else ""
    lines = [f"{head}{_label(d.get('action') or {})} (by the {d.get('origin') or 'planner'})"
             + (f"; outcome: {d['outcome']}" if d.get("outcome") else "")]
    lines.append(f"Reason: {d.get('reason') or 'not recorded'}")
    alts = d.get("alternatives") or []
    if alts:
        # the learned planner labels its numbers (a cost model's predictions); the baseline's are
        # roofline estimates
        source = alts[0].get("source") or "roofline estimate"
        lines.append(f"Top alternatives the policy weighed (probability, predicted time; {source}):")
        lines += [f"  - {a['action']}: p={a['prob']:.2f}"
                  + (f", {a['predicted_ms']:.4f} ms" if isinstance(a.get("predicted_ms"), (int, float)) else "")
                  + (f" ({a['predicted_gain']:+.1%} vs now)" if isinstance(a.get("predicted_gain"), (int, float)) else "")
                  + (f", validity {a['p_valid']:.2f}" if isinstance(a.get("p_valid"), (int, float)) else "")
                  for a in alts[:5]]
    if d.get("policy"):
        lines.append(f"Policy: {d['policy']}")
    return lines


def _limits(verdict: dict, spec: KernelSpec, hw: HardwareProfile, what: str = "this draft") -> list[str]:
    lines = [f"Hardware limits ({hw.name}) for {what}:"]
    if not verdict.get("ok") and verdict.get("kind"):
        lines.append(f"  - failed at {verdict.get('stage')}: {verdict['kind']}: {(verdict.get('detail') or '')[:300]}")
    for k in (verdict.get("resources") or {}).get("kernels") or []:
        regs, warps = k.get("regs"), k.get("num_warps")
        reg_text = f"{regs} registers/thread of {hw.max_regs_per_thread}"
        if isinstance(regs, int) and isinstance(warps, int):
            reg_text += f" ({regs * warps * hw.warp_size} of {hw.regs_per_sm} per SM for one block)"
        lines.append(f"  - {k.get('name', 'kernel')}: shared memory {k.get('shared_bytes', 0)} B of "
                     f"{hw.smem_per_block} B per block; {reg_text}; {k.get('spill_bytes', 0)} B spilled; "
                     f"{k.get('blocks_per_sm', '?')} blocks/SM, occupancy {k.get('occupancy', '?')}")
    ms = verdict.get("time_ms")
    if isinstance(ms, (int, float)) and ms > 0:
        flops, nbytes = family_of(spec).work(spec)
        gbs, tflops = nbytes / (ms * 1e6), flops / (ms * 1e9)
        peak = hw.peak_tflops(spec.dtype, tensor_core=spec.family == "matmul" and spec.dtype != "float32")
        ridge = peak * 1e3 / hw.bandwidth_gbs  # flop per byte where compute and memory balance
        bound = "memory" if flops / max(nbytes, 1) < ridge else "compute"
        lines.append(f"  - bandwidth: {nbytes / 1e6:.2f} MB at least moved -> {gbs:.0f} GB/s of "
                     f"{hw.bandwidth_gbs:.0f} GB/s ({gbs / hw.bandwidth_gbs:.0%}); compute {tflops:.2f} of "
                     f"{peak:.0f} TFLOP/s; intensity {flops / max(nbytes, 1):.1f} flop/B vs ridge "
                     f"{ridge:.1f}: {bound}-bound")
    return lines


def _evidence(verdict: dict) -> list[str]:
    lines = []
    corr = verdict.get("correctness") or {}
    if corr:
        lines.append(f"Checked: {corr.get('reason', 'correctness checked')} (max rel err "
                     f"{corr.get('max_rel_err', float('nan')):.2g} of tolerance, dims {corr.get('dims')}, "
                     f"{corr.get('device')})")
    ms, timing = verdict.get("time_ms"), verdict.get("timing") or {}
    if isinstance(ms, (int, float)):
        if verdict.get("measured"):
            lines.append(f"Measured: {ms:.4f} ms on {timing.get('device', 'the GPU')}")
        else:
            lines.append(f"Estimated, not measured: {ms:.4f} ms ({timing.get('label', 'roofline model, no GPU')})")
    return lines


def _memory_used(history: dict | None) -> list[str]:
    if not history:
        return []
    lines = []
    if history.get("warm_start"):
        lines.append(f"Memory: this lineage started from history {history['warm_start']} (its final config "
                     "was the first draft, re-verified here).")
    if history.get("retrieved"):
        lines.append(f"Memory: histories retrieved before planning: {', '.join(history['retrieved'])}.")
    return lines


def _fusion(spec: KernelSpec, state: dict) -> list[str]:
    best = state.get("best") or {}
    kernels = ((best.get("verdict") or {}).get("resources") or {}).get("kernels") or []
    names = ", ".join(k.get("name", "kernel") for k in kernels) or "the template's kernel"
    knobs = ", ".join(family_of(spec).config_space(spec))
    return [f"No step fused anything because nothing was left to fuse: {describe(spec)} is written as one "
            f"template whose ops run in the same kernel ({names}).",
            f"The planner's moves for the {spec.family} family turn {knobs}; fusing across ops is decided "
            "earlier, when a captured module is split into fusion groups."]


def _similar(spec: KernelSpec, gpu: str, own_id: str | None, store: Store | None) -> list[str]:
    try:
        found = (store or Store()).similar(spec.to_dict(), gpu, k=4)
    except MemoryUnavailable as exc:
        return [f"Similar past histories: unavailable ({exc})."]
    found = [h for h in found if h["id"] != own_id][:3]
    if not found:
        return [f"Similar past histories on {gpu}: none stored yet."]
    lines = [f"Similar past histories on {gpu}:"]
    for h in found:
        ms = h.get("time_ms")
        timing = "" if ms is None else f", {ms:.4f} ms {'measured' if h['measured'] else 'estimated'}"
        stale = f"; stale ({'; '.join(h['stale_reasons'])})" if h.get("stale") else ""
        lines.append(f"  - {h['id']}: {h['description']}: final {h['final_config']} at step {h['final_step']} "
                     f"of {h['drafts']}{timing}{stale}")
    return lines
