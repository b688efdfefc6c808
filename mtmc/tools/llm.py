"""The optional chat model: an OpenAI-compatible endpoint (vLLM, Ollama, OpenAI) reached through
langchain-openai's ChatOpenAI.  One job: build the client and get one text reply from it.

Every way the model can fail to answer (nothing listening, a timeout, an HTTP error, a reply
that is not a chat completion, an empty reply) becomes an LLMFailure whose message says why in
a few words, so the caller can fall back to what it had without the model.  langchain-openai is
imported only when a model is built: the core runs without it.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

TIMEOUT_S = 45.0          # per attempt
MAX_RETRIES = 1           # the client's own retries (connection errors, 408/429/5xx)
MAX_TOKENS = 800
_THINK = re.compile(r"<think>.*?(</think>|$)", re.S)


class LLMFailure(RuntimeError):
    """The model could not be used; str() says why in a few words ("connection refused")."""

# The LLM roles' prompt texts live beside the package, in the repository's prompts/ (DESIGN.md).
PROMPTS = Path(__file__).resolve().parents[2] / "prompts"


def prompt(name: str) -> str:
    """The prompt text of one role (prompts/NAME.md)."""
    return (PROMPTS / f"{name}.md").read_text().strip()


def build(base_url: str, model: str, api_key: str = "", timeout_s: float = TIMEOUT_S):
    """A ChatOpenAI client for `model` at `base_url`, or None when either is empty (offline).
    Raises LLMFailure when langchain-openai is not installed."""
    if not (base_url.strip() and model.strip()):
        return None
    try:
        from langchain_openai import ChatOpenAI
    except ImportError as exc:
        raise LLMFailure(f"langchain-openai is not installed ({exc})") from exc
    # Local servers (vLLM, Ollama) take any key; the client insists on one.
    return ChatOpenAI(base_url=base_url.strip(), model=model.strip(), api_key=api_key or "none",
                      timeout=timeout_s, max_retries=MAX_RETRIES, max_tokens=MAX_TOKENS, temperature=0.2)


def from_env():
    """The model named by MTMC_LLM_BASE_URL, MTMC_LLM_MODEL (and MTMC_LLM_API_KEY), or None."""
    return build(os.environ.get("MTMC_LLM_BASE_URL", ""), os.environ.get("MTMC_LLM_MODEL", ""),
                 os.environ.get("MTMC_LLM_API_KEY", ""))


def endpoint(llm) -> str:
    """Where `llm` sends its requests, for messages ("the model at ...")."""
    return str(getattr(llm, "openai_api_base", None) or getattr(llm, "base_url", None) or "the configured endpoint")


def ask(llm, system: str, user: str, role: str = "", calls: list | None = None, json_reply: bool = False) -> str:
    """The model's reply to one system + user message, stripped; LLMFailure when there is none.
    `calls` (a run's list) gets one record per call: role, latency, tokens, and why it failed.
    json_reply asks for a JSON object (response_format) where the server takes it, plain text
    where it refuses the option (remembered per endpoint and model)."""
    start = time.monotonic()
    record = {"role": role or "llm", "ok": False, "latency_s": 0.0, "prompt_tokens": None,
              "completion_tokens": None}
    if calls is not None:
        calls.append(record)
    try:
        text, usage = _reply_text(llm, system, user, json_reply)
    except LLMFailure as exc:
        record["error"] = str(exc)
        raise
    finally:
        record["latency_s"] = round(time.monotonic() - start, 3)
    record.update(ok=True, **usage)
    return text


_NO_JSON_MODE: set[tuple[str, str]] = set()   # (endpoint, model) that refused response_format


def _reply_text(llm, system: str, user: str, json_reply: bool) -> tuple[str, dict]:
    key = (endpoint(llm), str(getattr(llm, "model_name", "")))
    bound = llm
    if json_reply and key not in _NO_JSON_MODE:
        bound = llm.bind(response_format={"type": "json_object"})
    start = time.monotonic()
    try:
        reply = bound.invoke([("system", system), ("user", user)])
    except Exception as exc:  # the client raises many kinds; each becomes a reason in words
        if bound is not llm and getattr(exc, "status_code", None) in (400, 404, 415, 422, 501):
            _NO_JSON_MODE.add(key)      # the server does not take JSON mode: ask again in plain text
            return _reply_text(llm, system, user, json_reply)
        raise LLMFailure(_reason(exc, time.monotonic() - start)) from exc
    text = _content(reply)
    if json_reply and (getattr(reply, "response_metadata", None) or {}).get("finish_reason") == "length":
        raise LLMFailure("truncated reply (the model hit its token limit)")
    return text, _usage(reply)


ATTEMPTS = 3        # replies a role asks for before it gives up (bad format, invalid content)
# Worth asking again: the model answered, but not in the form asked for.  A dead endpoint, a
# timeout or an HTTP error is not retried here (the client already retried once).
_RETRY = ("malformed reply", "empty reply", "truncated reply", "off-format reply", "invalid: ")


def ask_json(llm, system: str, user: str, check, role: str = "", calls: list | None = None,
             attempts: int = ATTEMPTS):
    """check(the reply's JSON object) -> a result, or ValueError with the reason it is unusable; a
    bad reply is shown its reason and asked again, at most `attempts` times.  LLMFailure (the
    last reason) when no reply is usable."""
    note = ""
    for _ in range(attempts):
        try:
            text = ask(llm, system, user + note, role=role, calls=calls, json_reply=True)
            return check(json_object(text))
        except ValueError as exc:
            failure = f"invalid: {exc}" if not str(exc).startswith("off-format") else str(exc)
        except LLMFailure as exc:
            failure = str(exc)
            if not failure.startswith(_RETRY):
                raise
        if calls:
            calls[-1].update(ok=False, error=failure)
        note = (f"\n\nYour last reply could not be used ({_short(failure, 400)}). Answer again with one JSON "
                "object in the format asked for, nothing else.")
    raise LLMFailure(f"{attempts} replies, none usable; the last: {failure}")


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def json_object(text: str) -> dict:
    """The JSON object a reply holds (bare, in a code fence, or amid words); ValueError otherwise."""
    import json
    fenced = _FENCE.search(text)
    body = fenced.group(1) if fenced else text[text.find("{"):text.rfind("}") + 1]
    try:
        value = json.loads(body)
    except ValueError:
        raise ValueError(f"off-format reply (not a JSON object: {_short(text, 80)})") from None
    if not isinstance(value, dict):
        raise ValueError(f"off-format reply (JSON {type(value).__name__}, not an object)")
    return value


def _usage(reply) -> dict:
    meta = getattr(reply, "usage_metadata", None) or {}
    return {"prompt_tokens": meta.get("input_tokens"), "completion_tokens": meta.get("output_tokens")}


def _content(reply) -> str:
    content = getattr(reply, "content", reply)
    if isinstance(content, list):  # content blocks: keep the text ones
        content = "".join(b if isinstance(b, str) else str(b.get("text", "")) for b in content
                          if isinstance(b, (str, dict)))
    if not isinstance(content, str):
        raise LLMFailure(f"malformed reply (content is {type(content).__name__})")
    content = _THINK.sub("", content)   # reasoning models (Qwen3, R1) may send their thinking inline
    if not content.strip():
        raise LLMFailure("empty reply")
    return content.strip()


def _reason(exc: Exception, elapsed: float) -> str:
    try:
        import openai
    except ImportError:
        openai = None
    if openai is not None:
        if isinstance(exc, getattr(openai, "LengthFinishReasonError", ())):   # JSON mode, cut off
            return "truncated reply (the model hit its token limit)"
        if isinstance(exc, openai.APITimeoutError):
            return f"timed out after {elapsed:.0f} s"
        if isinstance(exc, openai.APIConnectionError):
            chain = _chain(exc)
            if any(isinstance(e, ConnectionRefusedError) for e in chain):
                return "connection refused"
            return f"could not connect ({_short(chain[-1])})"
        if isinstance(exc, openai.APIStatusError):
            body = exc.body if isinstance(exc.body, dict) else {}
            error = body.get("error") if isinstance(body.get("error"), dict) else body
            detail = error.get("message") or error.get("detail") if isinstance(error, dict) else None
            return f"HTTP {exc.status_code}" + (f" ({_short(detail)})" if detail else "")
        if isinstance(exc, openai.APIResponseValidationError):
            return f"malformed reply ({_short(exc)})"
    return f"malformed reply ({type(exc).__name__}: {_short(exc)})"


def _chain(exc: BaseException) -> list[BaseException]:
    """exc and what caused it, outermost first."""
    out = [exc]
    while (nxt := out[-1].__cause__ or out[-1].__context__) is not None and nxt not in out:
        out.append(nxt)
    return out


def _short(what, limit: int = 160) -> str:
    text = " ".join(str(what).split()) or type(what).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
