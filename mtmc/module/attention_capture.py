"""nn.MultiheadAttention, expanded while the capture traces it (runs in the capture child).

torch.fx keeps nn.MultiheadAttention as one opaque call, so none of its work could become a
kernel.  Where the call is one the pieces compute exactly (batched input, attention weights
unused, no masks, dropout 0 or eval mode, no bias_k / zero attention), the capture traces it
again as its parts: the input projection (one fused QKV linear for self-attention), the head
split as views, F.scaled_dot_product_attention, the head merge and the output projection.  The
parameters stay the module's (get_attr of attn.in_proj_weight ...), so ModelNew still loads
Model's state_dict; fusion then makes matmul groups of the projections and an attention group
of the core.
"""
from __future__ import annotations

import operator


def _supported(m, node, values: dict) -> bool:
    """The call `node` of MultiheadAttention `m` computes what the expansion computes."""
    if m.dropout and m.training:
        return False
    if getattr(m, "bias_k", None) is not None or m.add_zero_attn:
        return False
    args = list(node.args) + [None] * 3
    given = {**dict(zip(("query", "key", "value"), args[:3])), **node.kwargs}
    if any(given.get(k) is not None for k in ("key_padding_mask", "attn_mask")) or given.get("is_causal"):
        return False
    if len(node.args) > 3:   # positional key_padding_mask / need_weights ...: keep it simple
        return False
    shapes = []
    for k in ("query", "key", "value"):
        v = values.get(getattr(given.get(k), "name", None), {})
        shapes.append(v.get("tensor", {}).get("shape"))
    if any(s is None or len(s) != 3 for s in shapes):   # unbatched input: torch's own path
        return False
    # the output tuple: only its first element is read (the averaged weights are never used)
    for user in node.users:
        if user.op != "call_function" or user.target is not operator.getitem or user.args[1] not in (0, 1):
            return False
        if user.args[1] == 1 and user.users:
            return False
    return True


def expandable(graph, root, values: dict) -> set[str]:
    """Qualified names of the MultiheadAttention calls of a traced graph to trace as their parts;
    values: the recorded value of every node (shapes)."""
    import torch.nn as nn
    found = set()
    for n in graph.nodes:
        if n.op == "call_module" and isinstance(root.get_submodule(n.target), nn.MultiheadAttention):
            if _supported(root.get_submodule(n.target), n, values):
                found.add(n.target)
    return found


def expanded_forward(m):
    """MultiheadAttention's forward as traceable parts (batched input, weights not returned)."""
    import torch.nn.functional as F
    heads, dim = m.num_heads, m.head_dim

    def split(t):   # [L, N, E] -> [N, heads, L, dim] (batch_first: [N, L, E] -> ...), a view
        t = t.view(t.shape[0], t.shape[1], heads, dim)
        return t.transpose(1, 2) if m.batch_first else t.permute(1, 2, 0, 3)

    def forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if m._qkv_same_embed_dim and query is key and key is value:   # self-attention: one QKV linear
            q, k, v = F.linear(query, m.in_proj_weight, m.in_proj_bias).chunk(3, dim=-1)
        else:
            e = m.embed_dim   # slices, not chunk(): a traced chunk cannot be iterated
            if m._qkv_same_embed_dim:
                w = m.in_proj_weight
                ws = (w[:e], w[e:2 * e], w[2 * e:])
            else:
                ws = (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)
            bias = m.in_proj_bias
            bs = (bias[:e], bias[e:2 * e], bias[2 * e:]) if bias is not None else (None, None, None)
            q, k, v = (F.linear(x, w, b) for x, w, b in zip((query, key, value), ws, bs))
        o = F.scaled_dot_product_attention(split(q), split(k), split(v))
        o = o.transpose(1, 2) if m.batch_first else o.permute(2, 0, 1, 3)
        return F.linear(o.flatten(2), m.out_proj.weight, m.out_proj.bias), None

    return forward
