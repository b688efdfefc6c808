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


# Scans and losses (the scan and loss families), at KernelBench level-1 sizes and a few-long-rows scan
SCANLOSS_TASKS = [
    "cumsum along the rows of a 32768x32768 fp32 tensor",
    "cumsum along the rows of a 128x65536 fp32 tensor",
    "reverse cumulative sum of a 32768x32768 fp32 tensor",
    "masked cumsum of a 32768x32768 fp32 tensor",
    "exclusive prefix sum over the rows of a 4096x32768 bf16 tensor",
    "cumprod of a 32768x32768 fp32 tensor",
    "cross entropy loss of 32768x4096 fp32 logits",
    "triplet margin loss with margin 1.0 on 32768x8192 fp32 embeddings",
    "mse loss of two 32768x32768 fp32 tensors",
    "huber loss of two 32768x32768 fp32 tensors",
    "kl divergence with batchmean reduction of 32768x32768 fp32 tensors",
    "cosine similarity loss of 32768x8192 fp32 tensors",
    "hinge loss of 32768x32768 fp32 tensors",
]
