"""Answers to a chat's next message about a finished run: what it asks for (followup: a
why-question, a change to the last spec, or a new request) and the why-answers (explainer)."""
