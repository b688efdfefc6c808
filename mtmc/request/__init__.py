"""A request in words -> KernelSpec (rules, no LLM): request.parse.parse_request; follow-ups in a
conversation: request.followup."""
