"""nn.MultiheadAttention (and nn.TransformerEncoderLayer / nn.TransformerEncoder around it),
expanded while the capture traces it (runs in the capture child).

torch.fx keeps these torch.nn modules as one opaque call each, so none of their work could
become a kernel.  Where the call is one the pieces compute exactly (batched input, attention
weights unused, no masks, dropout 0 or eval mode, no bias_k / zero attention), the capture
traces it again as its parts (an encoder layer: its norms, linears, activation and residuals
around the attention, post- or pre-norm; an encoder: its layers and final norm); attention: the input projection (one fused QKV linear for self-attention), the head
split as views, F.scaled_dot_product_attention, the head merge and the output projection.  The
parameters stay the module's (get_attr of attn.in_proj_weight ...), so ModelNew still loads
Model's state_dict; fusion then makes matmul groups of the projections and an attention group
of the core.
"""
from __future__ import annotations

import operator


def _mha_ok(m) -> bool:
    """MultiheadAttention settings the expansion computes exactly."""
    return not (m.dropout and m.training) and getattr(m, "bias_k", None) is None and not m.add_zero_attn


def _layer_ok(m) -> bool:
    """A TransformerEncoderLayer the expansion computes exactly (no dropout in training mode)."""
    drops = (m.dropout.p, m.dropout1.p, m.dropout2.p)
    return _mha_ok(m.self_attn) and not (m.training and any(drops)) and callable(m.activation)


def _batched_input_only(node, values: dict, names: tuple[str, ...], extra: tuple[str, ...]) -> bool:
    """The call passes batched 3-D tensors as `names` and nothing (None / False) as `extra`."""
    if len(node.args) > len(names):   # positional masks, need_weights ...: keep it simple
        return False
    given = {**dict(zip(names, node.args)), **node.kwargs}
    if any(given.get(k) not in (None, False) for k in extra):
        return False
    shapes = [values.get(getattr(given.get(k), "name", None), {}).get("tensor", {}).get("shape") for k in names]
    return all(s is not None and len(s) == 3 for s in shapes)   # unbatched input: torch's own path


def _weights_unused(node) -> bool:
    """Only the first element of the MultiheadAttention's output tuple is read."""
    for user in node.users:
        if user.op != "call_function" or user.target is not operator.getitem or user.args[1] not in (0, 1):
            return False
        if user.args[1] == 1 and user.users:
            return False
    return True


def expandable(graph, root, values: dict) -> set[str]:
    """Qualified names of the MultiheadAttention / TransformerEncoderLayer / TransformerEncoder
    calls of a traced graph (and the attention modules inside them) to trace as their parts;
    values: the recorded value of every node (shapes)."""
    import torch.nn as nn
    found = set()
    for n in graph.nodes:
        if n.op != "call_module":
            continue
        m = root.get_submodule(n.target)
        if isinstance(m, nn.MultiheadAttention):
            if _mha_ok(m) and _weights_unused(n) and _batched_input_only(
                    n, values, ("query", "key", "value"), ("key_padding_mask", "attn_mask", "is_causal")):
                found.add(n.target)
        elif isinstance(m, nn.TransformerEncoderLayer):
            if _layer_ok(m) and _batched_input_only(n, values, ("src",), ("src_mask", "src_key_padding_mask",
                                                                          "is_causal")):
                found |= {n.target, f"{n.target}.self_attn"}
        elif isinstance(m, nn.TransformerEncoder):
            if all(isinstance(layer, nn.TransformerEncoderLayer) and _layer_ok(layer) for layer in m.layers) and \
                    _batched_input_only(n, values, ("src",), ("mask", "src_key_padding_mask", "is_causal")):
                found.add(n.target)
                for i in range(len(m.layers)):
                    found |= {f"{n.target}.layers.{i}", f"{n.target}.layers.{i}.self_attn"}
    return found


def expanded_forward(m):
    """The forward of a module in `expandable`'s set, as traceable parts."""
    import torch.nn as nn
    if isinstance(m, nn.TransformerEncoder):
        return _encoder_forward(m)
    if isinstance(m, nn.TransformerEncoderLayer):
        return _layer_forward(m)
    return _mha_forward(m)


def _encoder_forward(m):
    def forward(src, mask=None, src_key_padding_mask=None, is_causal=None):
        x = src
        for layer in m.layers:
            x = layer(x)
        return m.norm(x) if m.norm is not None else x
    return forward


def _layer_forward(m):
    """TransformerEncoderLayer's math (post- or pre-norm), its submodules called as they are."""
    def attend(x):
        return m.self_attn(x, x, x, need_weights=False)[0]

    def feed_forward(x):
        return m.linear2(m.dropout(m.activation(m.linear1(x))))

    def forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if m.norm_first:
            x = x + m.dropout1(attend(m.norm1(x)))
            return x + m.dropout2(feed_forward(m.norm2(x)))
        x = m.norm1(x + m.dropout1(attend(x)))
        return m.norm2(x + m.dropout2(feed_forward(x)))
    return forward


def _mha_forward(m):
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
