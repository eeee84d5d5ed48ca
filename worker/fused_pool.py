"""The built-in model's max-pool and ReLU as one AVX-512 or AVX2 kernel
(``fused_pool.cpp``): ``performance.fused_pool``.

aten's channels-last max-pool keeps int64 indices, and its backward
zero-fills the whole input gradient (9.4 MB a step here) before scattering
into it; with ReLU's forward and backward around it that was about 3 ms of a
14-15 ms step. The kernel keeps a one-byte code per output and writes the
input gradient in one pass: the same values and gradients, bit for bit
(tests/unit/test_fused_pool.py), 0.94 of the step's time (BENCHMARKS.md).
In training it also applies the first dropout's mask and writes its output
NCHW (fc1's flatten order), and its backward takes the NCHW gradient: the
model's two layout copies and four passes over the tensor for the mask and
the scale go, bit for bit again (about a tenth of an fp32 step).

It is compiled on the node, once per kernel source and torch version, by
``python -m worker.fused_pool DIR`` (torch's cpp_extension: a C++ compiler
and ninja, about 20 s of one core), which the worker starts in the
background, idle-priority, when it first runs on a machine. Until it is
there, on CPUs without AVX2 and for anything but the built-in model's
float32 and bfloat16 channels-last shapes, ranks run aten's max-pool and
ReLU. The same source builds 16 lanes wide where the CPU has AVX-512 and 8
wide where it has AVX2 only (most AMD EPYC before Zen 4, Intel before
Skylake-SP): the same values either way.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from worker import cpu_features

if TYPE_CHECKING:
    import torch

# No torch at import: the daemon asks whether the kernel is built (and
# starts its build) without paying for torch.

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("fused_pool.cpp")
# The kernel's builds, the widest first: the CPU features each one's
# instructions need (Linux's /proc/cpuinfo names), and the compiler's flags.
BUILDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "AVX-512": (("avx512f", "avx512bw", "avx512vl"), ("-mavx512f", "-mavx512bw", "-mavx512vl")),
    "AVX2": (("avx2",), ("-mavx2",)),
}
LACKS = "this CPU lacks AVX-512 (avx512f, avx512bw, avx512vl) and AVX2"

_loaded: ModuleType | None = None
# Why this process runs aten's ops instead (None: the kernel is loaded).
_why_not: str | None = "not loaded"
# The loaded kernel's build ("AVX-512" or "AVX2").
_loaded_isa: str | None = None


@functools.cache
def module_name(isa: str | None = None) -> str:
    """Named after the source, the build and torch's version: a change to
    any is a new library, never a stale one loaded (nor one built for
    another CPU's instructions, in a directory machines share)."""
    isa = isa or cpu_isa()
    torch_version = importlib.metadata.version("torch")
    digest = hashlib.sha256(
        SOURCE.read_bytes() + torch_version.encode() + f"{isa}".encode()
    ).hexdigest()
    return f"ddpo_fused_pool_{digest[:16]}"


def library(directory: Path, isa: str | None = None) -> Path:
    return directory / f"{module_name(isa)}.so"


def runs_here(isa: str) -> bool:
    """Whether this CPU has the instructions of the build ``isa``."""
    return all(flag in cpu_features.flags() for flag in BUILDS[isa][0])


def cpu_isa() -> str | None:
    """The widest build this CPU runs (None: none, aten's ops)."""
    return next((isa for isa in BUILDS if runs_here(isa)), None)


def cpu_supports() -> bool:
    return cpu_isa() is not None


def _tool_path() -> str:
    """PATH with this environment's bin first: ninja from the ninja package,
    even where the worker runs without the environment on its PATH."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def can_compile() -> bool:
    """A C++ compiler and ninja to build with (not whether the CPU runs it)."""
    path = _tool_path()
    compiler = os.environ.get("CXX", "c++")
    return (
        shutil.which(compiler, path=path) is not None
        and shutil.which("ninja", path=path) is not None
    )


def build(directory: Path, isa: str | None = None) -> Path:
    """Compile the kernel into ``directory`` (a no-op when it is there), for
    ``isa`` (default: the widest this CPU runs). One build at a time per
    directory; the library appears whole (renamed into place), so a rank
    never loads a half-written one. Raises where it cannot (no compiler,
    neither AVX-512 nor AVX2)."""
    import torch  # noqa: F401 (its OpenMP runtime loaded, for _torch_openmp)
    from torch.utils import cpp_extension

    isa = isa or cpu_isa()
    if isa is None:
        raise RuntimeError(LACKS)
    if not runs_here(isa):
        raise RuntimeError(f"this CPU lacks {', '.join(BUILDS[isa][0])}")
    name = module_name(isa)
    target = library(directory, isa)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        openmp = _torch_openmp()
        os.environ["PATH"] = _tool_path()
        with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as work:
            cpp_extension.load(
                name,
                sources=[str(SOURCE)],
                build_directory=work,
                extra_cflags=["-O3", *BUILDS[isa][1], "-fopenmp"],
                # at::parallel_for on torch's own OpenMP runtime (the wheel's
                # libgomp): a second runtime would start threads of its own to
                # fight torch's for the cores (the step ran 1.37x slower).
                extra_ldflags=[str(openmp), f"-Wl,-rpath,{openmp.parent}"],
                verbose=False,
            )
            built = Path(work) / f"{name}.so"
            staged = directory / f".{target.name}.{os.getpid()}"
            shutil.copyfile(built, staged)
            os.replace(staged, target)
    return target


def _torch_openmp() -> Path:
    """The OpenMP runtime torch loaded in this process (the wheel's own
    libgomp, whatever its file is called), read from the process's maps."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = Path(line.split()[-1]) if "/" in line else None
        if path is not None and path.name.startswith("libgomp"):
            return path
    raise RuntimeError("torch's OpenMP runtime (libgomp) is not loaded: nothing to link to")


def status() -> str:
    """A line for the part's log: which max-pool this process runs."""
    if _why_not is None:
        return f"max-pool and ReLU: the fused {_loaded_isa} kernel (performance.fused_pool)"
    return f"max-pool and ReLU: aten's ({_why_not})"


def load(directory: Path | None, isa: str | None = None) -> str | None:
    """Load the kernel built in ``directory`` for this process (the build
    ``isa``, default the widest this CPU runs); None when it is in use, else
    why aten's ops run instead (also kept for status())."""
    global _why_not
    _why_not = _load(directory, isa)
    return _why_not


def disable(why: str) -> None:
    global _loaded, _loaded_isa, _why_not
    _loaded, _loaded_isa, _why_not = None, None, why


def _load(directory: Path | None, isa: str | None) -> str | None:
    global _loaded, _loaded_isa
    if _loaded is not None:
        return None
    if directory is None:
        return "no extensions directory"
    isa = isa or cpu_isa()
    if isa is None:
        return LACKS
    if not runs_here(isa):
        return f"this CPU lacks {', '.join(BUILDS[isa][0])}"
    path = library(directory, isa)
    if not path.exists():
        return f"not built in {directory} yet"
    try:
        loader = importlib.machinery.ExtensionFileLoader(module_name(isa), str(path))
        spec = importlib.util.spec_from_file_location(module_name(isa), path, loader=loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except Exception as exc:  # a library that will not load: aten's path, said why
        return f"{path} did not load: {exc}"
    _loaded, _loaded_isa = module, isa
    return None


def applies(x: torch.Tensor) -> bool:
    """Whether the loaded kernel takes ``x``: float32 or bfloat16 (bf16-mixed's
    activations) on the CPU, laid out channels-last, channels in sixteens,
    even height and width."""
    import torch

    return (
        _loaded is not None
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.bfloat16)
        and x.dim() == 4
        and x.shape[1] % 16 == 0
        and x.shape[2] % 2 == 0
        and x.shape[3] % 2 == 0
        and x.is_contiguous(memory_format=torch.channels_last)
    )


@functools.cache
def _functions() -> Any:
    """The kernel's autograd functions, made once torch is imported:
    (channels-last out, NCHW out with the dropout)."""
    import torch

    class PoolRelu(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            assert _loaded is not None
            out, code = _loaded.fwd(x)
            ctx.save_for_backward(code)
            ctx.size = (x.shape[2], x.shape[3])
            return torch.as_tensor(out)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            assert _loaded is not None
            (code,) = ctx.saved_tensors
            return torch.as_tensor(_loaded.bwd(grad, code, *ctx.size))

    class PoolReluNCHW(torch.autograd.Function):
        @staticmethod
        def forward(
            ctx: Any, x: torch.Tensor, keep: torch.Tensor | None, scale: float
        ) -> torch.Tensor:
            assert _loaded is not None
            out, code = _loaded.fwd_nchw(x, keep, scale)
            ctx.save_for_backward(code, keep)
            ctx.scale, ctx.size = scale, (x.shape[2], x.shape[3])
            return torch.as_tensor(out)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
            assert _loaded is not None
            code, keep = ctx.saved_tensors
            gx = _loaded.bwd_nchw(grad, code, keep, ctx.scale, *ctx.size)
            return torch.as_tensor(gx), None, None

    return PoolRelu, PoolReluNCHW


def pool_relu(x: torch.Tensor) -> torch.Tensor:
    """``relu(max_pool2d(x, 2))`` through the kernel (``applies(x)`` first)."""
    _check(x)
    out: torch.Tensor = _functions()[0].apply(x)
    return out


def _check(x: torch.Tensor) -> None:
    # The kernel indexes x as the shapes applies() admits: any other tensor
    # would be read past its end, not refused.
    if not applies(x):
        raise ValueError(
            "the fused max-pool takes a loaded kernel and a channels-last float32 or "
            "bfloat16 CPU tensor, channels in sixteens, even height and width"
        )


def pool_relu_nchw(
    x: torch.Tensor, keep: torch.Tensor | None = None, scale: float = 1.0
) -> torch.Tensor:
    """``relu(max_pool2d(x, 2)).contiguous()`` (NCHW) through the kernel,
    and with ``keep`` (a bool mask of the output's shape, NCHW) the dropout
    ``y * keep * scale``, in one pass each way: the same values and
    gradients bit for bit (``applies(x)`` first)."""
    import torch

    _check(x)
    if keep is not None:
        # The kernel reads it by index: a mask of another shape or layout
        # would be read past its end.
        expected = (x.shape[0], x.shape[1], x.shape[2] // 2, x.shape[3] // 2)
        if keep.dtype != torch.bool or tuple(keep.shape) != expected or not keep.is_contiguous():
            raise ValueError(f"keep must be a contiguous bool tensor of shape {expected}")
    out: torch.Tensor = _functions()[1].apply(x, keep, scale)
    return out


def _lower_priority() -> None:
    """Run only on cores nothing else wants: a job training beside the
    build keeps its speed (the build waits)."""
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    with contextlib.suppress(OSError):
        os.nice(19)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m worker.fused_pool",
        description="Compile the fused max-pool kernel into DIRECTORY (a no-op when it is "
        "there). Exit 1 where it cannot be built: jobs then run aten's ops.",
    )
    parser.add_argument("directory", type=Path)
    parser.add_argument(
        "--isa",
        choices=list(BUILDS),
        help="the build (default: the widest this CPU runs; AVX2 also runs on AVX-512 CPUs)",
    )
    parser.add_argument(
        "--idle", action="store_true", help="run at idle priority (how a worker starts it)"
    )
    parser.add_argument("--parent", type=int, help="exit when this process (the worker) does")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s worker.fused_pool: %(message)s"
    )
    if args.parent is not None:
        from worker._process import die_with_parent

        die_with_parent(args.parent)
    if args.idle:
        _lower_priority()
    try:
        path = build(args.directory, args.isa)
    except Exception as exc:  # no compiler, no AVX2: jobs run aten's ops
        log.warning("fused max-pool kernel not built: %s", exc)
        return 1
    log.info("fused max-pool kernel at %s", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
