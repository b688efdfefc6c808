"""The project's own benchmark requests: every catalog family, at sizes that fill an H200."""

SPINE_TASKS = [
    "softmax over the rows of a 4096x8192 fp16 tensor",
    "log-softmax over the rows of an 8192x4096 bf16 tensor",
    "layernorm on 8192 rows of width 4096 in fp16",
    "rmsnorm on 8192 rows of width 4096 in bf16",
    "row sum of a 8192x8192 fp32 tensor",
    "argmax over the rows of a 4096x16384 fp16 tensor",
    "add a bias then gelu on a 8192x8192 fp16 tensor",
    "relu(x + y) for two 4096x4096 fp32 tensors",
    "matmul 4096x4096 by 4096x4096 in fp16",
    "linear layer with 4096 inputs and 4096 outputs on a batch of 8192 tokens in bf16 with bias and relu",
    "batched matmul 32x512x512 by 32x512x1024 in bf16 with a relu",
    "matmul 2048x2048 by 2048x2048 in fp32",
]

# Normalizations at KernelBench-like sizes: statistics over channels and groups of millions of
# elements (the split path), rows of L1 / L2 normalization, one norm over a whole tensor.
NORM_TASKS = [
    "batch norm on a 64x64x512x512 fp32 tensor",
    "batch norm on a 16384x4096 fp32 tensor, then gelu then relu",
    "batchnorm in eval mode on a 32x128x112x112 bf16 tensor",
    "group norm with 8 groups on a 112x64x512x512 fp32 tensor",
    "group norm with 512 groups on a 1024x8192 fp16 tensor",
    "instance norm on a 128x128x126x126 fp32 tensor, then scale by 0.5",
    "frobenius norm normalization of a 112x64x512x512 fp32 tensor",
    "l2 normalize the rows of a 32768x65535 fp32 tensor",
    "l1 normalize the rows of a 32768x65535 fp32 tensor",
    "layernorm on 16 rows of width 4194304 in fp32",
]
