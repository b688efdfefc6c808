"""The parser role with a model: when the rules refuse a request or are unsure of it, and a chat
model is configured, the model maps the words to a KernelSpec JSON that the family validates
(bad replies are asked again, a bounded number of times).  The rules' reading is shown beside the
model's when they differ.  Without a model, or when it cannot be used, the answer is exactly the
rules' (`parse_request`); a dead endpoint never stops a request the rules can serve.

A request outside the catalog comes back from the model as a PyTorch reference with its input
shapes ({"custom": ...}); `custom` on the result holds it for the coder role to write a kernel for."""
from __future__ import annotations

import json
from dataclasses import dataclass

from mtmc.kernels.catalog import describe, families, family_of
from mtmc.kernels.spec import DTYPES, KernelSpec
from mtmc.request.parse import EXAMPLES, ParseResult, _success_message, parse_request
from mtmc.tools.llm import LLMFailure, ask_json, endpoint, prompt

ROLE = "parser"
# Assumptions that mean the rules chose between readings: a model, when there is one, decides.
_UNSURE = ("read as a matrix product",)


@dataclass
class CustomOp:
    """An op outside the catalog as the model described it: a torch reference and its inputs."""

    name: str
    reference: str          # source of `def reference(*inputs)`, torch only
    inputs: list[dict]      # [{"shape": [...], "dtype": "float32"}], in argument order


def unsure(result: ParseResult) -> bool:
    return not result.ok or any(a.startswith(_UNSURE) or any(u in a for u in _UNSURE) for a in result.assumptions)


def read_request(text: str, llm=None, calls: list | None = None) -> tuple[ParseResult, CustomOp | None]:
    """The rules' ParseResult, or the model's reading when the rules refuse or are unsure; the
    CustomOp when the model says the op is outside the catalog.  Never raises."""
    rules = parse_request(text)
    if llm is None or not unsure(rules) or not isinstance(text, str):
        return rules, None
    try:
        kind, value = ask_json(llm, prompt(ROLE), _user_message(text, rules), _check, role=ROLE, calls=calls)
    except LLMFailure as exc:
        note = f"the model at {endpoint(llm)} could not be used ({exc})"
        if rules.ok:
            return ParseResult(rules.spec, rules.understood, [*rules.assumptions, note + ": the rules' reading stands"],
                               rules.message), None
        return ParseResult(None, rules.understood, rules.assumptions, f"{rules.message}\n({note[0].upper()}{note[1:]}.)"), None
    why_not_rules = "" if rules.ok else f" (the rules could not: {rules.message.splitlines()[0]})"
    if kind == "refuse":
        message = f"The model at {endpoint(llm)} could not read it either: {value}"
        return ParseResult(None, rules.understood, rules.assumptions,
                           rules.message + "\n" + message if not rules.ok else message), None
    notes = [f"read by the model at {endpoint(llm)}{why_not_rules}"]
    if kind == "custom":
        notes.append(f"'{value.name}' is outside the catalog: the model wrote its PyTorch reference")
        return ParseResult(None, {"custom": value.name}, notes, f"{value.name}: outside the catalog; "
                           f"inputs {', '.join(_shape(i) for i in value.inputs)}."), value
    value.request = text
    other = rules.spec if rules.ok and rules.spec.key() != value.key() else None
    if other is not None:
        notes.append(f"the rules read it as {describe(other)} (say \"use the rules' reading\" to run that instead)")
    return ParseResult(value, {"llm": value.to_dict()}, notes, _success_message(value, notes), other), None


def _check(reply: dict):
    """The model's JSON -> ("spec", KernelSpec) | ("custom", CustomOp) | ("refuse", reason);
    ValueError with the reason a reply is unusable (the model is shown it and asked again)."""
    if isinstance(reply.get("refuse"), str):
        return "refuse", reply["refuse"].strip() or "no reason given"
    if isinstance(reply.get("custom"), dict):
        return "custom", custom_op(reply["custom"])
    if reply.get("family") not in families():
        raise ValueError(f"family {reply.get('family')!r} is not one of {', '.join(families())}")
    if reply.get("dtype", "float32") not in DTYPES:
        raise ValueError(f"dtype {reply.get('dtype')!r} is not one of {', '.join(DTYPES)}")
    try:
        spec = KernelSpec.from_dict(reply)
        if not isinstance(spec.params, dict):
            raise ValueError("params must be an object")
        family_of(spec).validate(spec)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a spec ({type(exc).__name__}: {exc})") from None
    return "spec", spec


def custom_op(body: dict) -> CustomOp:
    """The model's {"custom": ...} body -> CustomOp; ValueError with what is wrong."""
    name, source, inputs = body.get("name"), body.get("reference"), body.get("inputs")
    if not (isinstance(name, str) and name.isidentifier()):
        raise ValueError("custom.name must be a snake_case identifier")
    if not (isinstance(source, str) and "def reference(" in source):
        raise ValueError("custom.reference must define `def reference(...)`")
    try:
        compile(source, "<reference>", "exec")
    except SyntaxError as exc:
        raise ValueError(f"custom.reference does not parse: {exc}") from None
    if not (isinstance(inputs, list) and inputs):
        raise ValueError("custom.inputs must list every input's shape and dtype")
    for i in inputs:
        shape = i.get("shape") if isinstance(i, dict) else None
        if not (isinstance(shape, list) and shape and all(isinstance(d, int) and d >= 1 for d in shape)):
            raise ValueError(f"custom.inputs: {i!r} needs a shape of positive integers")
        if i.setdefault("dtype", "float32") not in DTYPES:
            raise ValueError(f"custom.inputs: dtype {i['dtype']!r} is not one of {', '.join(DTYPES)}")
    return CustomOp(name, source, inputs)


def _shape(i: dict) -> str:
    return "x".join(map(str, i["shape"])) + f" {i['dtype']}"


def _user_message(text: str, rules: ParseResult) -> str:
    return "\n".join([f"Request: {text}", "",
                      "The rule-based parser's reading: " + rules.message.splitlines()[0], "",
                      "The catalog, as example requests and the spec each becomes:", *_catalog_lines()])


def _catalog_lines() -> list[str]:
    """Each family's example requests with the rules' spec for them (the format by example)."""
    lines = []
    for examples in EXAMPLES.values():
        for words in examples:
            spec = parse_request(words).spec
            if spec is not None:
                body = {k: v for k, v in spec.to_dict().items() if k != "request"}
                lines.append(f"- {words!r} -> {json.dumps(body)}")
    return lines
