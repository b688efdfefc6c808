"""Hardware profiles: the limits the resource checks and the roofline use.

Numbers are per device.  `bandwidth_gbs` and peaks are datasheet leads except where marked
measured (the H200's come from this workplace's measurements: 4.3 TB/s copy, ~790 TFLOP/s bf16).
`memory_bytes` is the device memory a program can hold: the datasheet's size, less what the
driver keeps (the H200's 141 GB show as about 139 GiB usable).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    arch: int                 # compute capability as an int: 90 for sm_90
    sms: int
    smem_per_block: int       # bytes usable by one block (opt-in maximum)
    smem_per_sm: int
    regs_per_sm: int
    max_regs_per_thread: int
    max_threads_per_sm: int
    l2_bytes: int
    bandwidth_gbs: float      # achievable DRAM bandwidth, GB/s
    fp32_tflops: float        # non-tensor-core fp32
    tc_tflops: dict           # tensor-core dense peak by input dtype
    warp_size: int = 32
    memory_bytes: int = 0     # device memory a program can use; 0: unknown (profiles stored before it)

    def to_dict(self) -> dict:
        return asdict(self)

    def fp32_matmul_tflops(self, precision: str) -> float:
        """fp32 products at fp32 accuracy: IEEE FMAs, or three TF32 tensor-core products each
        ("tf32x3", sm_80+), whichever the kernel uses."""
        if precision == "tf32x3" and "tf32" in self.tc_tflops:
            return max(self.fp32_tflops, self.tc_tflops["tf32"] / 3)
        return self.fp32_tflops

    def peak_tflops(self, dtype: str, tensor_core: bool) -> float:
        if tensor_core:
            return self.tc_tflops.get(dtype, self.fp32_tflops)
        return self.fp32_tflops


PROFILES: dict[str, HardwareProfile] = {
    "h200": HardwareProfile("NVIDIA H200", 90, 132, 232448, 233472, 65536, 255, 2048, 60 * 2**20,
                            4300.0, 67.0, {"float16": 790.0, "bfloat16": 790.0, "float32": 67.0, "tf32": 395.0},
                            memory_bytes=139 * 2**30),      # 141 GB, about 139 GiB usable
    "h100": HardwareProfile("NVIDIA H100 SXM", 90, 132, 232448, 233472, 65536, 255, 2048, 50 * 2**20,
                            3000.0, 67.0, {"float16": 750.0, "bfloat16": 750.0, "float32": 67.0, "tf32": 375.0},
                            memory_bytes=80 * 10**9),
    "a100": HardwareProfile("NVIDIA A100 SXM", 80, 108, 166912, 167936, 65536, 255, 2048, 40 * 2**20,
                            1700.0, 19.5, {"float16": 280.0, "bfloat16": 280.0, "float32": 19.5, "tf32": 140.0},
                            memory_bytes=80 * 10**9),
    "v100": HardwareProfile("NVIDIA V100 SXM2", 70, 80, 98304, 98304, 65536, 255, 2048, 6 * 2**20,
                            800.0, 15.7, {"float16": 110.0, "float32": 15.7},
                            memory_bytes=32 * 10**9),
}


def get_profile(name: str) -> HardwareProfile:
    key = name.lower().replace("nvidia", "").replace(" ", "").replace("-", "")
    for k, prof in PROFILES.items():
        if key.startswith(k):
            return prof
    raise ValueError(f"unknown GPU profile {name!r}; known: {', '.join(PROFILES)}")


def gpu_available() -> bool:
    import torch
    return torch.cuda.is_available()


def present_gpu() -> HardwareProfile | None:
    """The profile of the GPU in this process, read from torch, or None without one."""
    import torch
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    try:
        base = get_profile(props.name)
    except ValueError:
        base = None
    major, minor = torch.cuda.get_device_capability(0)
    smem_block = getattr(props, "shared_memory_per_block_optin", None) or (base.smem_per_block if base else 49152)
    return HardwareProfile(
        name=props.name, arch=major * 10 + minor, sms=props.multi_processor_count,
        smem_per_block=int(smem_block),
        smem_per_sm=int(getattr(props, "shared_memory_per_multiprocessor", smem_block)),
        regs_per_sm=int(getattr(props, "regs_per_multiprocessor", 65536)),
        max_regs_per_thread=255,
        max_threads_per_sm=int(getattr(props, "max_threads_per_multi_processor", 2048)),
        l2_bytes=int(getattr(props, "L2_cache_size", base.l2_bytes if base else 0)),
        bandwidth_gbs=base.bandwidth_gbs if base else 1000.0,
        fp32_tflops=base.fp32_tflops if base else 10.0,
        tc_tflops=base.tc_tflops if base else {},
        memory_bytes=int(props.total_memory),
    )


def resolve(target: str | None) -> HardwareProfile:
    """`target` names a profile; None or "auto" means the present GPU, else the H200."""
    if target and target != "auto":
        return get_profile(target)
    return present_gpu() or PROFILES["h200"]
