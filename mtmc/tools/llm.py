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


def ask(llm, system: str, user: str) -> str:
    """The model's reply to one system + user message, stripped; LLMFailure when there is none."""
    start = time.monotonic()
    try:
        reply = llm.invoke([("system", system), ("user", user)])
    except Exception as exc:  # the client raises many kinds; each becomes a reason in words
        raise LLMFailure(_reason(exc, time.monotonic() - start)) from exc
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
