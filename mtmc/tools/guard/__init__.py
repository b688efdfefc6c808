"""A module verifier that is hard to fool: `verify(REFERENCE.py, CANDIDATE.py)`.

REFERENCE defines Model, get_inputs, get_init_inputs; CANDIDATE defines ModelNew with the same
constructor.  The reference runs in one sandboxed child (guard.reference), the candidate in
another that never holds the reference's outputs (guard.candidate, instrumented by
guard.probes); the parent judges (guard.checks, guard.numeric) and assembles the verdict
(guard.verifier); guard.report puts it in words.
"""
from mtmc.tools.guard.report import as_module_check, format_verdict
from mtmc.tools.guard.verifier import (
    DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S, ReferenceFailed, ReferenceRun, check_candidate, invalid_reference,
    run_reference, verify,
)

__all__ = ["verify", "run_reference", "check_candidate", "ReferenceRun", "ReferenceFailed", "format_verdict",
           "as_module_check", "invalid_reference", "DEFAULT_TIMEOUT_S", "DEFAULT_MEMORY_MB"]
