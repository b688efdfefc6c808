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

# Activations and general reductions (memory-bound: judged on bandwidth at ~1-2 GB per pass).
POINTRED_TASKS = [
    "selu on a 16384x16384 fp32 tensor",
    "softplus with beta 2 and threshold 10 on a 16384x16384 fp16 tensor",
    "mish on a [64, 4096, 4096] bf16 tensor",
    "elu with alpha 0.5 then hardswish on a 16384x16384 fp32 tensor",
    "logsumexp over the last dim of a 65536x4096 fp16 tensor",
    "product over each row of a 65536x1024 fp32 tensor",
    "sum over dims 2 and 3 of a 128x256x64x64 fp32 tensor",
    "max over dim 1 of a 128x4096x1024 fp16 tensor",
    "argmax over dim 1 of a 64x4096x1024 fp32 tensor",
    "row-wise sum of a 16384x16384 fp32 tensor then scale by 0.5",
]
