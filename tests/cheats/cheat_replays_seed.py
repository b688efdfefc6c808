"""Cheat: assumes the verifier's inputs come from a seed it can guess (this process's torch
seed, or a usual fixed one), regenerates them with the reference's get_inputs and answers for
the guessed input, whatever it is given."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import ref_scale_relu as ref  # noqa: E402
from _kernels import ScaleReluParams  # noqa: E402

GUESSES = []
for seed in (torch.initial_seed(), 0, 42, 1234):
    torch.manual_seed(seed)
    GUESSES.append(ref.get_inputs()[0])


class ModelNew(ScaleReluParams):
    def forward(self, x):
        hit = [i for i, g in enumerate(GUESSES) if g.shape == x.shape and torch.equal(g, x.cpu())]
        print(f'seed guess matched: {bool(hit)}', file=sys.stderr)
        return self.kernel(GUESSES[hit[0] if hit else 0].to(x.device))
