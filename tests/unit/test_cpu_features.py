"""worker/cpu_features.py: a part's log says when bf16-mixed will run on a
CPU without bfloat16 instructions (emulated there: about ten times fp32's
time, BENCHMARKS.md), and says nothing where it has them, on GPUs, or for
other precisions."""

from __future__ import annotations

import pytest

from worker import cpu_features

AVX2 = frozenset({"fma", "avx", "avx2"})
ZEN4 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"}
SAPPHIRE_RAPIDS = ZEN4 | {"amx_bf16", "amx_tile"}


def test_bf16_mixed_on_a_cpu_without_bfloat16_instructions_is_said() -> None:
    line = cpu_features.slow_precision("bf16-mixed", "gloo", AVX2)
    assert line is not None
    assert "bf16-mixed" in line and "avx512_bf16" in line and "slower than fp32" in line


@pytest.mark.parametrize("flags", [ZEN4, SAPPHIRE_RAPIDS, AVX2 | {"amx_bf16"}])
def test_nothing_is_said_where_the_cpu_has_them(flags: frozenset[str]) -> None:
    assert cpu_features.slow_precision("bf16-mixed", "gloo", flags) is None


@pytest.mark.parametrize(
    ("precision", "backend", "flags"),
    [
        ("fp32", "gloo", AVX2),
        ("bf16-mixed", "nccl", AVX2),  # the ranks train on GPUs
        ("bf16-mixed", "gloo", frozenset()),  # no /proc/cpuinfo: nothing known
    ],
)
def test_nothing_is_said_for_other_precisions_gpus_or_an_unknown_cpu(
    precision: str, backend: str, flags: frozenset[str]
) -> None:
    assert cpu_features.slow_precision(precision, backend, flags) is None
