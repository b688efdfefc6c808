"""Tensors between the guard's processes, without multi-GB files.

  share(tree, directory, name) -> payload (JSON)     in the sending process
  receive(payload, limit_bytes) -> tree              in the receiving process

CUDA tensors cross as CUDA IPC handles (torch.multiprocessing's reductions): a few hundred bytes
each, the data stays where it is on the GPU.  The receiver rebuilds them with an unpickler that
accepts only what a shared CUDA tensor is made of, so a sender cannot make it run code.  The
sender must keep its tensors alive until the receiver has answered; the guard's call order
(verifier.py) guarantees that.  Everything else in the tree (CPU tensors, numbers, the tree's
shape) goes into a small torch.save file in the check's private directory, read back with
weights_only=True: on a GPU that file holds no tensor data; on the CPU (Triton's interpreter,
small shapes) it holds the tensors themselves.

Where the driver refuses to export a CUDA IPC handle (seen on an H200 host, driver 580, for a
process inside bubblewrap that dropped from root to its own uid: cudaIpcGetMemHandle returns
"invalid argument"), the tensors are staged through that file instead, and the receiver moves
them back to the GPU: slower, the same verdict.
"""
from __future__ import annotations

import base64
import io
import pickle
from pathlib import Path

_MARK = "\x00ipc:"   # stands in the saved tree for the k-th CUDA tensor
_ALLOWED = {("torch.multiprocessing.reductions", "rebuild_cuda_tensor"), ("torch", "Tensor"),
            ("torch.storage", "TypedStorage"), ("torch.storage", "UntypedStorage"), ("torch", "UntypedStorage"),
            ("torch", "Size"), ("torch", "device")}


class ExchangeError(ValueError):
    """A payload that cannot be read back as plain tensors and values."""


class _CudaOnly(pickle.Unpickler):
    def find_class(self, module, name):
        import torch
        if (module, name) in _ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise ExchangeError(f"refused {module}.{name} in a shared-tensor payload")


def share(tree, directory: str | Path, name: str) -> dict:
    import torch
    from torch.utils._pytree import tree_map
    cuda: list = []

    def mark(x):
        if isinstance(x, torch.Tensor) and x.is_cuda:
            cuda.append(x.detach())
            return f"{_MARK}{len(cuda) - 1}"
        return x.detach() if isinstance(x, torch.Tensor) else x
    skeleton = tree_map(mark, tree)
    path = Path(directory) / f"{name}.pt"
    payload = {"file": str(path)}
    if cuda:
        try:
            payload["ipc"] = _ipc_handles(cuda)
        except RuntimeError:   # torch.AcceleratorError: the driver refused the export here
            skeleton = tree_map(lambda x: cuda[int(x[len(_MARK):])].cpu() if _marked(x) else x, skeleton)
            payload["staged"] = True
    torch.save(skeleton, path)
    return payload


_EXPORTS: list[bool] = []   # whether this process may export CUDA IPC handles, once found out


def ipc_exports() -> bool:
    """Whether the driver lets this process export a CUDA IPC handle (a one-element probe)."""
    if not _EXPORTS:
        import torch
        try:
            _ipc_handles([torch.zeros(1, device="cuda")])
            _EXPORTS.append(True)
        except RuntimeError:
            _EXPORTS.append(False)
    return _EXPORTS[0]


def staged_cap(device: str, max_elems: int | None, exports) -> int | None:
    """The per-input element cap of a guard session: where CUDA tensors must be staged through
    files (`exports()` false), full-size inputs would cost their size several times over in
    files per variant (a 6.4 GB KernelBench input filled a 64 GB disk), so the batch is cut to
    STAGED_MAX_ELEMS per input; each group's kernel is still checked at full size on its own."""
    if device != "cuda" or max_elems is not None or exports():
        return max_elems
    return STAGED_MAX_ELEMS


STAGED_MAX_ELEMS = 1 << 26   # 256 MB of fp32 per input


def _marked(x) -> bool:
    return isinstance(x, str) and x.startswith(_MARK)


def _ipc_handles(cuda: list) -> str:
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers the CUDA tensor reductions)
    return base64.b64encode(bytes(ForkingPickler.dumps(cuda))).decode()


def receive(payload: dict, limit_bytes: int | None = None):
    import torch
    from torch.utils._pytree import tree_map
    path = Path(payload["file"])
    if not path.exists():
        raise ExchangeError("the shared tensors' file is missing")
    if limit_bytes is not None and path.stat().st_size > limit_bytes:
        raise ExchangeError(f"the shared tensors' file is {path.stat().st_size} bytes, more than {limit_bytes}")
    try:
        skeleton = torch.load(path, weights_only=True)
    except Exception as e:
        raise ExchangeError(f"the shared tensors' file is unreadable ({type(e).__name__})") from None
    cuda = _CudaOnly(io.BytesIO(base64.b64decode(payload["ipc"]))).load() if payload.get("ipc") else []
    if not isinstance(cuda, list) or not all(type(t) is torch.Tensor for t in cuda):
        raise ExchangeError("the shared CUDA tensors are not a list of plain tensors")

    def unmark(x):
        if _marked(x):
            return cuda[int(x[len(_MARK):])]
        if payload.get("staged") and isinstance(x, torch.Tensor):
            return x.cuda()
        return x
    return tree_map(unmark, skeleton)
