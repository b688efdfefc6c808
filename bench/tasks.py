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

# Pooling (KernelBench level-1 shapes and the pools that follow convs): several GB moved each.
POOLING_TASKS = [
    "max pool 3x3 stride 2 padding 1 on a 32x64x512x512 fp16 tensor",
    "maxpool1d kernel 8 stride 1 padding 4 dilation 3 on 64x192x65536",
    "max pool 3x3x3 stride 2 padding 1 dilation 3 on 16x32x128x128x128",
    "avg pool 11x11 on a 16x64x2048x2048 tensor",
    "avg pool 3x3x3 stride 2 padding 1 on 16x32x128x128x128 bf16, then gelu",
    "max pool 2x2 on a 128x256x224x224 bf16 tensor with indices",
    "adaptive avg pool to 7x7 on 256x512x56x56 fp16",
    "global average pooling over a 512x2048x14x14 bf16 tensor",
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
    "variance over the rows of a 16384x16384 fp32 tensor then sqrt",
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

# Row ops over other dims (softmax over the channels of conv outputs, read in place) and
# reductions of a whole tensor to one value (split over the GPU): ~1-4 GB per pass.
EXTRAS_TASKS = [
    "softmax over dim 1 of a 128x128x128x128 fp32 tensor",
    "softmax along the channel dim of a 16x64x32x128x128 fp16 tensor then add a bias, then sigmoid",
    "log softmax over dim 1 of a 64x1024x4096 bf16 tensor",
    "softmax over dim 0 of a 4096x65536 fp32 tensor",
    "sum of all elements of a 32768x32768 fp32 tensor",
    "mean over all dims of a 64x4096x4096 fp16 tensor",
    "max over all dims of a 64x4096x4096 fp32 tensor",
    "logsumexp over all dims of a 16384x16384 fp32 tensor",
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

# Attention (one flash kernel per request): each fills an H200 with >= 1024 query tiles
ATTENTION_TASKS = [
    "causal flash attention, batch 16, 16 heads, sequence length 4096, head dim 64, fp16",
    "flash attention, batch 8, 32 heads, sequence length 2048, head dim 128, bf16",
    "multi-head attention with 12 heads over 32x1024x768 fp16 activations, causal",
    "sdpa with an additive mask, q 8x16x1024x128 and k/v 8x16x4096x128 in bf16",
    "flash attention 16x16x2048x64 fp16 with a boolean mask",
    "scaled dot product attention on q, k, v of shape 32x32x512x64 in fp32",
]

# Two-tensor formulas as one kernel, and convs with reflect / replicate / circular padding served by
# the conv gather (no padded copy): plain words at sizes that fill an H200.
EXTRAS2_TASKS = [
    "relu(x) + relu(y) on two 8192x8192 fp16 tensors",
    "x * sigmoid(y) on 16384x8192 bf16 tensors",
    "abs(x - y) * z on 8192x8192 fp32 tensors",
    "conv2d 3x3 reflect padding 1 on 16x64x224x224 fp16 with 64 output channels",
    "conv1d kernel 5 padding 2 padding_mode='circular' on 32x64x65536 bf16 with 64 output channels",
    "replicate-padded 3x3 conv, padding 1, on 16x128x112x112 bf16 with 128 output channels, then relu",
]
