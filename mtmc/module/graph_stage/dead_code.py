"""Values nothing reads, removed with what only fed them (KernelBench's LSTMHn computes
`self.fc(out[:, -1, :])` and returns the LSTM's state instead: a GEMM for nothing).

A node is dead when no node reads it and it is not the graph's output; it goes with the nodes
that only fed it, if each is pure: a function or method that changes nothing in place, a module
call that keeps no state (never a norm tracking running statistics in training mode).  Refused
where a random op would go while another stays (the one that stays would draw other numbers).
"""
from __future__ import annotations

from mtmc.module.fx_ops import Graph
from mtmc.module.graph_stage.edit import Editor, pure, readers, stateless_module_calls
from mtmc.module.graph_stage.records import Candidate, Work
from mtmc.module.graph_stage.simplify import shifts_random_draws, work_of

RULE = "dead_code"


def candidates(desc: dict) -> list[Candidate]:
    g = Graph(desc)
    read = readers(desc)
    stateless = stateless_module_calls(desc)
    found = []
    for n in g.nodes:
        name = n["name"]
        if not n["op"].startswith("call_") or name in read or g.tensor(name) is None:
            continue
        ops = [g.words(name)]
        if not pure(n, stateless):
            found.append(Candidate(RULE, name, g.path, False, f"{g.words(name)} is read by nothing, but it changes "
                                   "state (in place, or a norm's running statistics): it stays", ops=ops))
            continue
        ed = Editor(desc)
        ed.nodes.remove(ed.node(name))
        dropped = [name] + ed.drop_dead(read | {name}, stateless)
        if shifts_random_draws(g, ed.desc, dropped):
            found.append(Candidate(RULE, name, g.path, False, f"{g.words(name)} is read by nothing, but removing it "
                                   "would change the numbers a random op after it draws", ops=ops))
            continue
        gone = [g.words(d) for d in dropped if g.by_name[d]["op"] != "get_attr"]
        found.append(Candidate(RULE, name, g.path, True, "exact: the value reaches no output", ops=gone,
                               result="nothing (removed)", before=work_of(g, dropped), after=Work(),
                               dtype=g.tensor(name)[1], apply=ed.desc))
    return found
