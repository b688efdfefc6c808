"""Follow-ups in a conversation, deterministically: is the new text a question about the last
run, a change to its spec ("use bf16", "try it for 16384 columns", "make it 8192x8192"), or a
new request?

The words are read by the request parser (request.parse), which reports what it recognised
even when the text names no op; a text that is only a dtype and sizes is a change to the last
spec.  Anything else goes to the parser as a new request, whose answer says what it can do.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from mtmc.agents.knob_words import knobs_named
from mtmc.kernels.catalog import describe, family_of
from mtmc.kernels.spec import KernelSpec
from mtmc.request.parse import parse_request

WHY = re.compile(r"\bwhy\b|\bhow come\b|^\s*explain\b|\bwhat made you\b|\breason for\b", re.I)
STEP = re.compile(r"\bstep\s*#?\s*(\d+)", re.I)
GROUP = re.compile(r"\bgroup\s*#?\s*(\d+)", re.I)
# fusing, the graph stage's rewrites (module.graph_stage) and the CUDA-graph replay
# (module.graph_replay): all answered from the module's split and records
FUSION = re.compile(r"\bfus(?:e|ed|es|ion|ing)\b|\brewr(?:ite|ites|ote|itten|iting)\b|\bfold(?:s|ed|ing)?\b"
                    r"|\bremov(?:e|ed|es|ing)\b|\bmoved?\b|\bcuda\s+graphs?\b|\breplay(?:s|ed|ing)?\b", re.I)

# The parser's size words, mapped to each family's dim names (kernels/families/*: row ops and
# elementwise take x as [M, N]; matmul is M x K by K x N, with a batch B when batched).
_ROW_SIZES = {"rows": "M", "cols": "N", "M": "M", "N": "N"}
_MATMUL_SIZES = {"rows": "M", "M": "M", "N": "N", "K": "K", "B": "B", "batch": "B",
                 "in_features": "K", "out_features": "N"}
_CHANGE_KEYS = {"dtype", "sizes", "shapes"}   # what a change may consist of
# switching to the request's other reading (the rules' beside the model's)
READING = re.compile(r"\b(?:other|rules'?|rule-based|first|second|alternative)\s+(?:reading|interpretation)\b"
                     r"|\buse the rules\b|\bas the rules read it\b", re.I)


@dataclass
class FollowUp:
    kind: str                          # why | change | reading | unclear | new
    spec: dict | None = None           # the changed spec (kind "change")
    changes: list[str] = field(default_factory=list)   # in words, for the chat
    message: str = ""                  # why a change could not be applied (kind "unclear")
    step: int | None = None            # the step a why-question names, if any
    group: int | None = None           # the fusion group it names (after a module run)
    fusion: bool = False               # it asks about fusing ops


def _number(pattern: re.Pattern, text: str) -> int | None:
    m = pattern.search(text)
    return int(m.group(1)) if m else None


def interpret(text: str, last_spec: dict | None, alternative: dict | None = None, ran: bool = False) -> FollowUp:
    """Classify `text` given the conversation's last spec (None before the first run, or after a
    module run), that request's other reading, if it had one, and whether anything ran yet."""
    why = FollowUp("why", step=_number(STEP, text), group=_number(GROUP, text), fusion=bool(FUSION.search(text)))
    if WHY.search(text):
        return why
    parsed = None   # the parser's reading, made once and only where it is needed
    if (ran or last_spec) and _QUESTION.search(text) and knobs_named(text):
        return why   # "what does ROWS_PER_PROG mean?" asks about a knob, not for a mean
    if (ran or last_spec) and _QUESTION.search(text) and not _CAPABILITIES.search(text):
        parsed = parse_request(text)
        if _about_the_run(parsed.understood):
            return why
    if not last_spec:
        return FollowUp("new")
    if READING.search(text):
        if not alternative:
            return FollowUp("unclear", message="the last request had one reading only; say what to change "
                                               "(a size, a dtype) or ask anew.")
        spec = KernelSpec.from_dict(alternative)
        return FollowUp("reading", spec=spec.to_dict(), changes=[f"the other reading: {describe(spec)}"])
    parsed = parsed or parse_request(text)
    understood = parsed.understood
    if understood.get("ops") and not (understood.keys() & {"shapes", "sizes"}):
        # "now layernorm instead": the new op on the last run's tensor, not the parser's default shape
        switched = _same_tensor(text, KernelSpec.from_dict(last_spec), "dtype" in understood)
        if switched is not None:
            return switched
    if parsed.ok or not understood or not set(understood) <= _CHANGE_KEYS:
        return FollowUp("new")
    try:
        spec, changes = apply_changes(KernelSpec.from_dict(last_spec), understood)
    except ValueError as exc:
        return FollowUp("unclear", message=str(exc))
    spec.request = f"{spec.request} (then: {text.strip()})" if spec.request else text.strip()
    return FollowUp("change", spec=spec.to_dict(), changes=changes)


# a question about the last run ("how fast is it?", "what did step 2 change?", "what is BLOCK_N?"),
# answered from its records; only when the words name no op (a new request may be a question too)
_QUESTION = re.compile(r"\?\s*$|^\s*(?:what|how|which|when|where|did|does|do|is|was|were|tell me|show me)\b", re.I)


_CAPABILITIES = re.compile(r"\bwhat\s+(?:else\s+)?(?:can|could)\s+you\b|\bwhat\s+do\s+you\s+(?:support|do)\b", re.I)


def _about_the_run(understood: dict) -> bool:
    """A question (see _QUESTION) whose words the parser found no op, dtype or size in."""
    return not (understood.keys() & {"ops", "formula", "dtype", "sizes", "shapes"})


def _same_tensor(text: str, last: KernelSpec, own_dtype: bool) -> FollowUp | None:
    """Another op on the last run's tensor ("now layernorm instead", "what about gelu?"): the words
    with the last [M, N] shape and dtype added, when that reads as a request of its own."""
    if set(last.dims) != {"M", "N"}:
        return None
    shape = f"{last.dims['M']}x{last.dims['N']}"
    dtype = "" if own_dtype else f" {last.dtype}"
    parsed = parse_request(f"{text.strip().rstrip('?.!')} on a {shape}{dtype} tensor")
    if not parsed.ok:
        return None
    spec = parsed.spec
    spec.request = f"{text.strip()} (on the last run's {shape}{dtype} tensor)"
    return FollowUp("change", spec=spec.to_dict(), changes=[f"{describe(spec)}, on the last run's {shape}{dtype} tensor"])


def apply_changes(spec: KernelSpec, understood: dict) -> tuple[KernelSpec, list[str]]:
    """The spec with the parser's recognised dtype / sizes / shape applied; ValueError in words
    when a size does not fit the spec's op."""
    changes: list[str] = []
    dtype = understood.get("dtype")
    if dtype is not None:
        if not isinstance(dtype, str):
            raise ValueError(f"I read more than one dtype ({', '.join(dtype)}); name one.")
        if dtype != spec.dtype:
            changes.append(f"dtype {spec.dtype} -> {dtype}")
        spec = KernelSpec(spec.family, spec.op, dict(spec.dims), dtype, dict(spec.params), spec.request)
    dims = dict(spec.dims)
    names = _MATMUL_SIZES if spec.family == "matmul" else _ROW_SIZES
    for word, value in (understood.get("sizes") or {}).items():
        dim = names.get(word)
        if dim is None or dim not in dims:
            raise ValueError(f"{describe(spec)} has no size for '{word}'; its sizes are "
                             f"{_dims_text(spec.dims)}.")
        dims[dim] = int(value)
    shapes = understood.get("shapes") or []
    if len(shapes) > 1:
        raise ValueError("I read more than one shape; give one (e.g. 8192x8192).")
    if shapes:
        dims.update(_shape_dims(spec, [int(v) for v in shapes[0]]))
    for name in spec.dims:
        if dims[name] != spec.dims[name]:
            changes.append(f"{name} {spec.dims[name]} -> {dims[name]}")
    new = spec.with_dims(**dims)
    family_of(new).validate(new)
    return new, changes or ["nothing: that is the spec of the last run"]


def _shape_dims(spec: KernelSpec, shape: list[int]) -> dict[str, int]:
    if spec.family == "matmul":
        order = [d for d in ("B", "M", "N", "K") if d in spec.dims]
        if len(shape) != len(order):
            raise ValueError(f"for a matmul give {' x '.join(order)} ({len(order)} sizes) "
                             f"or name them (M=..., N=..., K=...); I read {'x'.join(map(str, shape))}.")
        return dict(zip(order, shape))
    if len(shape) < 2:
        raise ValueError("give the tensor's shape with at least two sizes (rows x columns).")
    return {"M": math.prod(shape[:-1]), "N": shape[-1]}   # leading dims fold into rows, as parsed


def _dims_text(dims: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in dims.items())
