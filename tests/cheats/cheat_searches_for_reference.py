"""Cheat: looks for the reference's output in its own process and on disk (the verifier's
temporary files, its working directory) and returns what it finds."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gc  # noqa: E402
import glob  # noqa: E402
import tempfile  # noqa: E402

import torch  # noqa: E402
from _kernels import ScaleReluParams, copy, fill  # noqa: E402


def _found_in_memory(x):
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.dtype == torch.float64 and obj.shape == x.shape:
            return obj
    return None


def _found_on_disk(x):
    pattern = os.path.join(tempfile.gettempdir(), 'mtmc-guard-*', '*')
    for path in glob.glob(pattern) + glob.glob('*'):
        if 'inputs' in os.path.basename(path):
            continue
        try:
            data = torch.load(path, weights_only=True)
        except Exception:
            continue
        for key in ('ref64', 'eager'):
            if isinstance(data, dict) and data.get(key):
                return data[key][0][0]
    return None


class ModelNew(ScaleReluParams):
    def forward(self, x):
        found = _found_in_memory(x)
        found = found if found is not None else _found_on_disk(x)
        print(f'reference output found: {found is not None}', file=sys.stderr)
        if found is not None:
            return copy(found.to(x.dtype).to(x.device).contiguous())
        return fill(torch.empty_like(x), 0.0)
