"""The prompt texts of the LLM roles, one module per role, plain strings (nothing of the project
is imported here).  Today one role uses an LLM: the explainer (prompts.explainer)."""
