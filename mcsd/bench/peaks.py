"""The denominator of MFU: a known GPU's dense peak matrix-multiply rate for the dtype, from its
maker's datasheet (dense: without 2:4 sparsity, which the datasheets' headline figures double);
elsewhere (a CPU, a GPU not listed) the fastest square product measured on the machine.

fp32 is the plain fp32 rate (CUDA cores: torch does not use TF32 for fp32 products unless told);
bf16 and fp16 are the tensor cores' rates with fp32 accumulation.
"""

from __future__ import annotations

import dataclasses

TERA = 1e12


@dataclasses.dataclass(frozen=True)
class GPUPeak:
    """A GPU model: the text its ``torch.cuda.get_device_name`` holds, its dense peaks (FLOP/s) by
    dtype name, and where they come from."""

    name: str
    matches: tuple[str, ...]
    flops: dict[str, float]
    source: str


def _peaks(fp32: float, bf16: float, fp16: float | None = None) -> dict[str, float]:
    return {"float32": fp32 * TERA, "bfloat16": bf16 * TERA, "float16": (fp16 or bf16) * TERA}


# In matching order: a more specific name before one it contains (H100 PCIe before H100, H200 NVL before H200,
# L40S before L4): the variants of one chip differ in clocks and power, and so in peak.
KNOWN_GPUS = (
    GPUPeak("H100 PCIe", ("H100 PCIe",), _peaks(51, 756), "NVIDIA H100 Tensor Core GPU datasheet (PCIe)"),
    GPUPeak("H100 NVL", ("H100 NVL",), _peaks(60, 835), "NVIDIA H100 Tensor Core GPU datasheet (NVL)"),
    GPUPeak("H100 SXM", ("H100",), _peaks(67, 989.4), "NVIDIA H100 Tensor Core GPU datasheet (SXM5)"),
    GPUPeak("H200 NVL", ("H200 NVL",), _peaks(60, 835.5), "NVIDIA H200 Tensor Core GPU datasheet (H200 NVL)"),
    GPUPeak("H200 SXM", ("H200",), _peaks(67, 989.4), "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM)"),
    GPUPeak("A100", ("A100",), _peaks(19.5, 312), "NVIDIA A100 Tensor Core GPU datasheet"),
    GPUPeak("L40S", ("L40S",), _peaks(91.6, 362.05), "NVIDIA L40S datasheet"),
    GPUPeak("L4", ("L4",), _peaks(30.3, 121), "NVIDIA L4 Tensor Core GPU datasheet"),
    GPUPeak("RTX 4090", ("RTX 4090",), _peaks(82.6, 165.2),
            "NVIDIA Ada GPU architecture whitepaper, appendix A (GeForce RTX 4090, fp32 accumulation)"),
    GPUPeak("RTX 3090", ("RTX 3090",), _peaks(35.6, 71),
            "NVIDIA Ampere GA102 GPU architecture whitepaper, table 9 (GeForce RTX 3090, fp32 accumulation)"),
)


def known_gpu(device_name: str) -> GPUPeak | None:
    """The table's entry for a GPU named ``device_name`` (``torch.cuda.get_device_name``), if any."""
    return next((gpu for gpu in KNOWN_GPUS if any(text in device_name for text in gpu.matches)), None)


def mfu_peak(device_type: str, device_name: str, dtype: str, measured: float) -> tuple[float, str]:
    """(the peak FLOP/s that MFU divides by, where it comes from): a known GPU's dense datasheet
    peak for ``dtype``; the ``measured`` matmul peak on a CPU or a GPU the table lacks (said so)."""
    gpu = known_gpu(device_name) if device_type == "cuda" else None
    if gpu is not None:
        return gpu.flops[dtype], f"{gpu.name} dense {dtype} peak ({gpu.source})"
    if device_type == "cuda":
        return measured, f"measured matmul peak ({device_name} is not in mcsd/bench/peaks.py)"
    return measured, "measured matmul peak"
