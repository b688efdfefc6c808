"""The benchmark scripts' own logic (their numbers come from the GPU, not from tests)."""
import ast

import pytest

from bench.modules import FULL_SIZE, MODULES, resized


def test_every_test_module_has_full_sizes_that_replace_its_constants():
    assert set(FULL_SIZE) == {p.name for p in MODULES.glob("*.py")}
    for name, sizes in FULL_SIZE.items():
        tree = ast.parse(resized((MODULES / name).read_text(), sizes))
        assigned = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                t = node.targets[0]
                names = [t.id] if isinstance(t, ast.Name) else [e.id for e in getattr(t, "elts", [])]
                values = [ast.literal_eval(node.value)] if isinstance(t, ast.Name) else ast.literal_eval(node.value)
                assigned.update(zip(names, values))
        assert {k: assigned[k] for k in sizes} == sizes, name


def test_a_size_the_module_does_not_assign_is_an_error():
    with pytest.raises(ValueError, match="no top-level assignment of \\['hidden'\\]"):
        resized("batch, rows = 2, 3\n", {"batch": 4, "hidden": 8})
    assert resized("batch, rows = 2, 3\nx = 1\n", {"rows": 30}) == "batch, rows = 2, 30\nx = 1\n"


def test_conv_layout_finds_every_conv_the_forward_calls_with_its_input():
    """bench.conv_layout times each conv of a task at the input it really gets (GPU only); which
    convs, and which inputs, is found on the CPU."""
    import torch
    from bench.conv_layout import _conv_inputs, _layout

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Conv2d(3, 4, 3), torch.nn.ConvTranspose3d(2, 2, 3)
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x, y):
            return self.fc(self.a(x).mean((2, 3))), self.b(y)

    net, x, y = Net(), torch.randn(2, 3, 8, 8), torch.randn(1, 2, 4, 4, 4)
    seen = _conv_inputs(net, [x, y])
    assert [(m, tuple(t.shape)) for m, t in seen] == [(net.a, (2, 3, 8, 8)), (net.b, (1, 2, 4, 4, 4))]
    assert _layout(4) is torch.channels_last and _layout(5) is torch.channels_last_3d and _layout(3) is None


def test_conv_layout_errors_tell_fp32_arithmetic_from_tf32(monkeypatch):
    """Each layout's error against float64 is measured on the conv itself: fp32 arithmetic (the CPU
    here) gives about 1e-7 of the largest value; a conv rounding its inputs to TF32 (emulated on
    the weights below) gives about 1e-4, which is what tells cuDNN's TF32 choice apart on a GPU."""
    import torch

    import bench.conv_layout as cl
    monkeypatch.setattr(cl, "bench_ms", lambda fn: (fn(), 1.0)[1])   # no GPU timer here; the convs still run
    conv, x = torch.nn.Conv2d(16, 8, 3), torch.randn(6, 16, 12, 12)
    row = cl.measure(conv, x)
    for col in ("nchw_err", "cl_err", "cl_ieee_err", "nchw_ieee_err"):
        assert 0 < row[col] < 1e-6, row
    with torch.no_grad():   # weights rounded to TF32's 10-bit mantissa: an error the columns must show
        truth = cl.copy.deepcopy(conv).double()(x[:cl.ERROR_SAMPLES].double())
        conv.weight.copy_((conv.weight.view(torch.int32) & ~0x1FFF).view(torch.float32))
        assert 1e-5 < cl._error(conv, x, None, truth) < 1e-2
