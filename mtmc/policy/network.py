"""The policy network: a small actor-critic that scores each legal action of a state.

The action set changes from state to state (each family has its knobs, and moves already tried
or masked drop out), so the actor does not have a fixed output per action: it encodes the state
and every candidate action (policy.env.action_vector) and scores each (state, action) pair; a
softmax over the legal ones, with the masked ones at -inf, gives the probabilities.  The critic
reads the state alone.  Inputs are normalized by statistics fixed when training starts (stored
with the weights).
"""
from __future__ import annotations

import torch
from torch import nn


def _mlp(n_in: int, hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, n_out))


class ActorCritic(nn.Module):
    def __init__(self, state_dim: int, action_dim: int, hidden: int = 128):
        super().__init__()
        self.state_dim, self.action_dim, self.hidden = state_dim, action_dim, hidden
        self.state_enc = nn.Sequential(_mlp(state_dim, hidden, hidden), nn.Tanh())
        self.action_enc = nn.Sequential(_mlp(action_dim, hidden, hidden), nn.Tanh())
        self.score = _mlp(3 * hidden, hidden, 1)
        self.value = _mlp(hidden, hidden, 1)
        self.register_buffer("s_mean", torch.zeros(state_dim))
        self.register_buffer("s_std", torch.ones(state_dim))

    def set_normalization(self, states: torch.Tensor) -> None:
        from mtmc.policy.cost_model import safe_std
        self.s_mean.copy_(states.mean(0))
        self.s_std.copy_(safe_std(states))

    def forward(self, s: torch.Tensor, a: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """s [B, S], a [B, A, D], mask [B, A] (True: legal) -> logits [B, A] (-inf where masked), value [B]."""
        hs = self.state_enc((s - self.s_mean) / self.s_std)
        ha = self.action_enc(a)
        hs_a = hs.unsqueeze(1).expand_as(ha)
        logits = self.score(torch.cat([hs_a, ha, hs_a * ha], dim=-1)).squeeze(-1)
        logits = logits.masked_fill(~mask, float("-inf"))
        return logits, self.value(hs).squeeze(-1)

    def config(self) -> dict:
        return {"state_dim": self.state_dim, "action_dim": self.action_dim, "hidden": self.hidden}


def pad(actions: list[list[list[float]]], action_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Action lists of different lengths as one [B, A, D] tensor and its legality mask."""
    width = max(len(a) for a in actions)
    out = torch.zeros(len(actions), width, action_dim)
    mask = torch.zeros(len(actions), width, dtype=torch.bool)
    for i, a in enumerate(actions):
        out[i, :len(a)] = torch.tensor(a, dtype=torch.float32)
        mask[i, :len(a)] = True
    return out, mask
