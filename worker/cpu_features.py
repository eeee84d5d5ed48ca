"""What this node's CPU can do, from Linux's /proc/cpuinfo flags: which
build of the fused max-pool it runs (worker/fused_pool.py), and whether
bf16-mixed has bfloat16 instructions to run on."""

from __future__ import annotations

import functools
from pathlib import Path

# Either gives oneDNN native bfloat16 products: AVX-512 BF16 (Cooper Lake,
# Zen 4 and later), AMX (Sapphire Rapids and later).
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def slow_precision(precision: str, backend: str, cpu_flags: frozenset[str]) -> str | None:
    """A line for the part's log where the job's precision will run far
    slower than fp32 on this CPU, else None. Without bfloat16 instructions
    autocast's bfloat16 convolutions are emulated: 10.7x fp32's time on
    an AVX2 CPU (BENCHMARKS.md), not the 1.5-1.9x gain seen where they
    exist. Said, not refused: the maths is what the job asked for. (NCCL's
    ranks train on GPUs, where this CPU does not matter.)"""
    if precision != "bf16-mixed" or backend == "nccl" or not cpu_flags:
        return None
    if any(flag in cpu_flags for flag in BF16_FLAGS):
        return None
    return (
        "performance.precision bf16-mixed on a CPU without bfloat16 instructions "
        f"({' or '.join(BF16_FLAGS)}): its bfloat16 products are emulated, several times "
        "slower than fp32 here"
    )
