"""The two LangGraph graphs and their nodes: graph.py (one kernel, from words or a spec) and
module_flow.py (an uploaded module, one kernel graph per fusion group); state, context, the
runner and the event stream.  Nothing here but graph nodes and what runs them."""
