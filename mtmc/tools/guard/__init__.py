"""A module verifier that is hard to fool: `verify(REFERENCE.py, CANDIDATE.py)`.

REFERENCE defines Model, get_inputs, get_init_inputs; CANDIDATE defines ModelNew with the same
constructor.  The reference runs in one sandboxed child (guard.reference), the candidate in
another that never holds the reference's outputs (guard.candidate, instrumented by
guard.probes); the parent judges (guard.checks, guard.numeric) and assembles the verdict
(guard.verifier); guard.report puts it in words.

This file imports nothing: its submodules import it as their parent, so a re-export here would
close a cycle (guard -> verifier -> worker -> guard.reference -> guard).
"""
