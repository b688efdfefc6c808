"""Per-conversation settings (target GPU profile, step budget, optional LLM endpoint) and the
status line that says what this machine can do."""
from __future__ import annotations

import importlib.util
import os
from dataclasses import asdict, dataclass

from mtmc.tools.hardware import PROFILES, present_gpu, resolve

DEFAULT_MAX_STEPS = 8


@dataclass
class Settings:
    target: str = "auto"          # a hardware profile name, or "auto" (the present GPU, else H200)
    max_steps: int = DEFAULT_MAX_STEPS
    llm_base_url: str = ""        # OpenAI-compatible endpoint; empty = offline
    llm_model: str = ""
    llm_api_key: str = ""         # kept in the session only; never shown or logged
    allow_tf32: bool = False      # uploaded modules' fp32 conv / matmul groups may multiply in TF32

    @classmethod
    def from_env(cls) -> "Settings":
        """The launch defaults: MTMC_MAX_STEPS, MTMC_TARGET, MTMC_LLM_BASE_URL, MTMC_LLM_MODEL,
        MTMC_LLM_API_KEY, MTMC_ALLOW_TF32 (1 = on)."""
        steps = os.environ.get("MTMC_MAX_STEPS", "")
        return cls(target=os.environ.get("MTMC_TARGET", "auto"),
                   max_steps=int(steps) if steps.isdigit() else DEFAULT_MAX_STEPS,
                   llm_base_url=os.environ.get("MTMC_LLM_BASE_URL", ""),
                   llm_model=os.environ.get("MTMC_LLM_MODEL", ""),
                   llm_api_key=os.environ.get("MTMC_LLM_API_KEY", ""),
                   allow_tf32=os.environ.get("MTMC_ALLOW_TF32", "") == "1")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "Settings":
        return cls(**{k: v for k, v in (d or {}).items() if k in cls.__dataclass_fields__})

    @property
    def llm_configured(self) -> bool:
        return bool(self.llm_base_url.strip() and self.llm_model.strip())


def target_choices() -> list[tuple[str, str]]:
    """(label, value) pairs for the target dropdown."""
    return [("auto: the GPU here, else H200", "auto")] + [(p.name, key) for key, p in PROFILES.items()]


def gpu_status() -> str:
    gpu = present_gpu()
    if gpu:
        return f"GPU: **{gpu.name}** (sm_{gpu.arch}); drafts are checked and timed on it"
    return ("GPU: **none**: correctness runs in Triton's interpreter on small shapes, resources come "
            "from a real compile for the target, and times are roofline estimates (labelled so)")


def llm_status(settings: Settings) -> str:
    # Say exactly which roles use the model, so nobody thinks it plans or codes.
    if not settings.llm_configured:
        return ("LLM: **offline**: the parser, planner, coder and debugger are deterministic, and "
                "why-answers are the structured facts from the run's records")
    where = f"`{settings.llm_model}` at `{settings.llm_base_url}`"
    if importlib.util.find_spec("langchain_openai") is None:
        return f"LLM: {where} is set, but langchain-openai is not installed here: **offline**"
    return (f"LLM: {where} writes the **why-answers** as prose from the run's recorded facts (shown "
            f"under each answer; if it cannot be reached the answer says why and gives the facts) and "
            f"reads the requests the rule parser refuses or is unsure of; planning and coding stay deterministic")


def isolation_status() -> str:
    """Whether uploaded modules run in an OS-level sandbox here (tools.isolation), in words."""
    from mtmc.tools.isolation import status
    st = status()
    return st.line().replace("isolation: on", "Isolation: **on**").replace("isolation: OFF", "Isolation: **OFF**")


def status_markdown(settings: Settings, parts: dict[str, str]) -> str:
    """Everything a user needs to know about what will happen on this machine."""
    try:
        target = resolve(settings.target).name + (" (auto)" if settings.target == "auto" else "")
    except ValueError as exc:
        target = f"unknown ({exc})"
    lines = [f"- {gpu_status()}", f"- {isolation_status()}",
             f"- Target profile: **{target}**; at most {settings.max_steps} planner steps per run",
             "- Precision: " + ("**TF32 allowed** in uploaded modules' fp32 conv and matmul groups (TF32-sized "
                                "error, checked with a widened tolerance)" if settings.allow_tf32 else
                                "fp32 accuracy for fp32 modules (TF32 off; a request in words may say 'tf32')"),
             f"- {llm_status(settings)}"]
    from mtmc.tools.cluster import SCHEDULER_ENV, cluster_status
    cluster = cluster_status()
    lines.append(f"- {cluster}" if cluster else f"- Cluster: none configured (set {SCHEDULER_ENV}=tcp://host:8786 "
                 "to show a Dask scheduler's workers here)")
    lines += [f"- {name}: {state}" for name, state in parts.items()]
    return "\n".join(lines)


def auth_from_env() -> list[tuple[str, str]] | None:
    """MTMC_AUTH="user:pass[,user2:pass2]" turns on login.  The variable is removed from the
    environment once read: the sandbox passes MTMC_* variables on to the child processes that
    run uploaded code, and they must not see it."""
    raw = os.environ.pop("MTMC_AUTH", "")
    pairs = [tuple(p.split(":", 1)) for p in raw.split(",") if ":" in p]
    if raw and not pairs:
        raise ValueError('MTMC_AUTH must look like "user:password" (several separated by commas)')
    return pairs or None
