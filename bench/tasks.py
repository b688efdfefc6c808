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

# Attention (one flash kernel per request): each fills an H200 with >= 1024 query tiles
ATTENTION_TASKS = [
    "causal flash attention, batch 16, 16 heads, sequence length 4096, head dim 64, fp16",
    "flash attention, batch 8, 32 heads, sequence length 2048, head dim 128, bf16",
    "multi-head attention with 12 heads over 32x1024x768 fp16 activations, causal",
    "sdpa with an additive mask, q 8x16x1024x128 and k/v 8x16x4096x128 in bf16",
    "flash attention 16x16x2048x64 fp16 with a boolean mask",
    "scaled dot product attention on q, k, v of shape 32x32x512x64 in fp32",
]
