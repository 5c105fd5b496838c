"""Launch compiled Triton kernels from XLA: our own FFI custom call, ``woa_triton_launch``.

A call site is lowered to ``jax.ffi.ffi_call`` with its kernels' cubins, entry names, launch
shapes and parameter maps as attributes (``lower``): one kernel, or a kernel and its programmatic
dependent, which only one call can keep overlapped in a command buffer. The handler
(``xla_launch.cc``, built here on first use with the system C++ compiler into
``WOA_CACHE_DIR``) loads each module once per kernel and CUDA context, then a call is one
``cuLaunchKernelEx`` per kernel on XLA's stream: no Python, no hashing of the kernel per call,
so back-to-back calls cost XLA's dispatch and the launches.

XLA may record the call into its command buffers (CUDA graphs): the execute handler carries the
command-buffer trait (the only way to mark it: the GPU plugin refuses traits at registration),
and the module is loaded by a separate initialize stage (``STAGES``), which XLA runs outside
stream capture. The parameter map (``params``) is the one ``native`` hands torch's eager
launcher: both libraries read it with ``launch_params.h``.

Kernels are compiled here, for the JAX device's compute capability, with every pointer and every
integer that is a multiple of 16 marked divisible by 16 (as torch's launcher marks them), so
JAX and torch run the same kernel bodies with the same specialization. Nothing here touches a
GPU; building needs a C++17 compiler (``CXX``, else ``c++`` / ``g++``), jaxlib's FFI headers and
Triton's ``cuda.h``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import pathlib
from typing import Any

import numpy as np

from . import native_build

TARGET = "woa_triton_launch"
_SOURCE = pathlib.Path(__file__).with_name("xla_launch.cc")
#: The handler's C symbol per FFI stage: initialize loads the module, execute launches it.
STAGES = {"initialize": "WoaTritonLoad", "execute": "WoaTritonLaunch"}

#: Values per TMA descriptor in a parameter map's ``tmaps`` (``launch_params.h``).
TENSOR_MAP_ROW = 12
#: Triton's pointer element types by NumPy / JAX dtype name.
_POINTER_TYPES = {
    "bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8_e4m3fn": "fp8e4nv",
    "float8_e5m2": "fp8e5", "uint8": "u8", "int8": "i8", "int32": "i32", "int64": "i64",
}


@dataclasses.dataclass(frozen=True)
class Ref:
    """A kernel parameter bound to an operand: inputs first, then outputs (``index`` counts
    across both, in ``ffi_call``'s order). ``offset`` and ``dtype`` make it a view into a byte
    buffer (a call's scratch): the pointer is ``offset`` bytes past the operand's start (a
    multiple of 16) and points at ``dtype`` elements (a NumPy name) instead of the operand's."""

    index: int
    offset: int = 0
    dtype: str | None = None

    def __post_init__(self):
        if self.offset % 16:
            raise ValueError(f"Ref offset {self.offset} is not a multiple of 16 bytes")


@dataclasses.dataclass(frozen=True)
class Desc:
    """A Gluon kernel's host TMA descriptor over operand ``index`` viewed as a row-major
    ``shape`` with ``row_stride`` elements between rows, loaded in ``block`` tiles of the
    shared-memory ``layout``; the handler encodes it for each call's buffer."""

    index: int
    shape: tuple[int, int]
    row_stride: int
    block: tuple[int, int]
    layout: Any  # a gluon NVMMASharedLayout
    dtype: str | None = None  # the elements, where not the operand's (as ``Ref.dtype``)


def build() -> pathlib.Path:
    """The handler library, compiled on first use (``native_build.build``).

    Raises ``RuntimeError`` with the compiler's message when it cannot be built.
    """
    import jax.ffi

    include, cuda = jax.ffi.include_dir(), native_build.cuda_include()
    return native_build.build(
        _SOURCE, (include, str(cuda)),
        (pathlib.Path(include) / "xla" / "ffi" / "api" / "c_api.h", cuda / "cuda.h"))


def handler_bundle(path: pathlib.Path) -> dict:
    """``{stage: capsule}`` of the built library at ``path`` (``STAGES``), as
    ``jax.ffi.register_ffi_target`` takes a multi-stage handler."""
    import ctypes

    import jax.ffi

    lib = ctypes.CDLL(str(path))
    return {stage: jax.ffi.pycapsule(getattr(lib, symbol)) for stage, symbol in STAGES.items()}


@functools.cache
def _registered() -> None:
    """Build the handler and register its stages with XLA for CUDA, once per process. No
    ``traits=``: the CUDA plugin rejects them; the trait is compiled into the execute stage."""
    import jax.ffi

    jax.ffi.register_ffi_target(TARGET, handler_bundle(build()), platform="CUDA")


def unavailable_reason() -> str | None:
    """``None`` when the handler builds and registers; else why not, in one line."""
    try:
        _registered()
    except (RuntimeError, OSError, ImportError, AttributeError) as e:
        return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    return None


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What a call site needs of a compiled kernel; ``tma``: per descriptor, the encoding
    Triton chose (``(CUtensorMapDataType, element bytes, swizzle, box)``); ``pdl``: launched
    as a programmatic dependent launch."""

    cubin: np.ndarray  # uint8
    name: str
    digest: int
    threads: int
    shared: int
    tma: tuple[tuple[int, int, int, tuple[int, ...]], ...]
    pdl: bool = False


def _specialize(kernel, args: tuple, dtypes: tuple[str, ...], constexprs: dict):
    """Triton's ``(signature, attrs, constexprs)`` for ``kernel`` on ``args`` (``Ref`` pointers
    of the given dtypes and integer scalars), specialized as Triton's launcher specializes:
    pointers and multiples of 16 divisible by 16, integers equal to 1 made constexprs."""
    runtime = [p for p in kernel.params if not p.is_constexpr]
    if len(runtime) != len(args):
        raise TypeError(f"{kernel.__name__} takes {len(runtime)} runtime arguments "
                        f"({', '.join(p.name for p in runtime)}), got {len(args)}")
    signature, attrs, cx = {}, {}, dict(constexprs)
    for p, a in zip(runtime, args, strict=True):
        if isinstance(a, Desc):
            dtype = _POINTER_TYPES[a.dtype or dtypes[a.index]]
            signature[p.name] = f"tensordesc<{dtype}{list(a.block)},{a.layout!r}>"
            continue
        if isinstance(a, Ref):
            signature[p.name] = "*" + _POINTER_TYPES[a.dtype or dtypes[a.index]]
            divisible = True  # XLA buffers are 16-byte aligned, offsets multiples of 16
        elif a == 1:
            cx[p.name] = 1
            continue
        else:
            signature[p.name] = "i32" if -2**31 <= a < 2**31 else "i64"
            divisible = a % 16 == 0
        if divisible:
            attrs[(kernel.arg_names.index(p.name),)] = [["tt.divisibility", 16]]
    signature.update((name, "constexpr") for name in cx)
    return signature, attrs, cx


def params(args: tuple, tma: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The parameter map (``params``, ``scalars``, ``tmaps``; ``launch_params.h``) of ``args``:
    ``_specialize``'s runtime ones, integers equal to 1 left out as Triton's specialization
    leaves them; ``tma`` is ``tma_encodings`` of the compiled kernel. A descriptor is its
    tensor map, then its shape (i32) and row strides (i64), as Triton's launcher expands it;
    a ``Ref`` with an offset is ``-3`` and its operand and offset among the scalars."""
    params, scalars, tmaps = [], [], []
    descs = iter(tma)
    for a in args:
        if isinstance(a, Desc):
            elem_type, elem_size, swizzle, box = next(descs)
            params += [-2] + [-1] * 4
            scalars += [*a.shape, a.row_stride, 1]
            tmaps += [a.index, elem_type, elem_size, swizzle, 0, 2, *box, *a.shape,
                      a.row_stride, 1]
        elif isinstance(a, Ref) and a.offset:
            params.append(-3)
            scalars += [a.index, a.offset]
        elif isinstance(a, Ref):
            params.append(a.index)
        elif a != 1:
            params.append(-1)
            scalars.append(a)
    return (np.array(params, np.int64), np.array(scalars, np.int64),
            np.array(tmaps, np.int64))


def compile_triton(kernel, args: tuple, dtypes: tuple[str, ...], constexprs: dict,
                   num_warps: int, num_stages: int | None, capability: int):
    """Triton's compiled kernel of ``kernel`` on ``args`` for ``sm_<capability>``
    (``_specialize``), a programmatic dependent launch where ``constexprs`` set ``PDL`` (as
    ``plans.Plan.compile_options`` asks torch's launcher); no GPU needed."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, attrs, cx = _specialize(kernel, args, dtypes, constexprs)
    options = {"num_warps": num_warps}
    if num_stages is not None:
        options["num_stages"] = num_stages
    if constexprs.get("PDL"):
        options["launch_pdl"] = True
    if any(isinstance(a, Desc) for a in args):
        from triton.experimental.gluon._runtime import GluonASTSource

        src = GluonASTSource(kernel, signature, cx, attrs)
    else:
        src = ASTSource(kernel, signature=signature, constexprs=cx, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)


def plain_launch(compiled) -> bool:
    """Whether the launch libraries can launch a compiled kernel as it is: one CTA per program,
    no global or profile scratch, not a cooperative grid (none of which they set up)."""
    md = compiled.metadata
    return (getattr(md, "num_ctas", 1) == 1 and not getattr(md, "global_scratch_size", 0)
            and not getattr(md, "profile_scratch_size", 0)
            and not getattr(md, "launch_cooperative_grid", False))


def programmatic(compiled) -> bool:
    """Whether a compiled kernel launches as a programmatic dependent launch (``launch_pdl``)."""
    return bool(getattr(compiled.metadata, "launch_pdl", False))


def tma_encodings(compiled) -> tuple[tuple[int, int, int, tuple[int, ...]], ...]:
    """Per TMA descriptor of a compiled kernel, the encoding Triton chose:
    ``(CUtensorMapDataType, element bytes, swizzle, box)``."""
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

    meta = getattr(compiled.metadata, "tensordesc_meta", None) or []
    return tuple((TMA_DTYPE_DEVICE_TO_HOST[m["elem_type"]], m["elem_size"], m["swizzle"],
                  tuple(m["block_size"])) for m in meta)


@functools.lru_cache(maxsize=256)
def compile_kernel(kernel, args: tuple, dtypes: tuple[str, ...], constexprs: tuple,
                   num_warps: int, num_stages: int | None, capability: int) -> Compiled:
    """``compile_triton``'s kernel as a call site needs it; cached per call shape.

    Raises ``ValueError`` for kernels the handler cannot launch (clusters, scratch memory).
    """
    compiled = compile_triton(kernel, args, dtypes, dict(constexprs), num_warps, num_stages,
                              capability)
    md = compiled.metadata
    if not plain_launch(compiled):
        raise ValueError(f"{kernel.__name__}: woa_triton_launch takes kernels with one CTA per "
                         f"program and no scratch memory")
    tma = tma_encodings(compiled)
    descs = sum(isinstance(a, Desc) for a in args)
    if len(tma) != descs:
        raise ValueError(f"{kernel.__name__}: expected {descs} TMA descriptors in the compiled "
                         f"kernel, found {len(tma)}")
    cubin = compiled.asm["cubin"]
    return Compiled(np.frombuffer(cubin, np.uint8).copy(), md.name,
                    int.from_bytes(hashlib.sha256(cubin).digest()[:8], "little", signed=True),
                    32 * md.num_warps, md.shared, tma, programmatic(compiled))


def lower(launches, arrays: tuple, out_shape: tuple, *, capability: int,
          aliases: dict[int, int] | None = None):
    """``launches``, in order, on ``arrays`` inside ``jax.jit``, as one custom call; the outputs.

    Each launch is ``kernel[grid](*args, **constexprs)`` with ``num_warps`` and ``num_stages``
    (attributes of that name; ``jax_launch.KernelCall``). ``args`` has one entry per runtime
    parameter, in order: a ``Ref`` to an input of ``arrays`` or an output of ``out_shape``
    (inputs first), a ``Desc`` over one, or an ``int``. A launch compiled as a programmatic
    dependent (``PDL``) overlaps the one before it. Outputs start uninitialized: the kernels
    write them whole, except those aliased to an input (``aliases``, ``{input index: output
    index}``, as ``ffi_call``'s ``input_output_aliases``): they start with the input's values,
    in its buffer, so XLA knows the kernels write that buffer.
    """
    import jax

    _registered()
    dtypes = tuple(np.dtype(a.dtype).name for a in (*arrays, *out_shape))
    cubins, names, rows, maps = [], [], [], ([], [], [])
    for launch in launches:
        compiled = compile_kernel(launch.kernel, tuple(launch.args), dtypes,
                                  tuple(dict(launch.constexprs).items()), launch.num_warps,
                                  launch.num_stages, capability)
        kernel_map = params(launch.args, compiled.tma)
        cubins.append(compiled.cubin)
        names.append(compiled.name)
        rows += [compiled.digest, compiled.cubin.size, *(*launch.grid, 1, 1)[:3],
                 compiled.threads, compiled.shared, int(compiled.pdl),
                 *(len(part) for part in kernel_map[:2]), len(kernel_map[2]) // TENSOR_MAP_ROW]
        for part, values in zip(maps, kernel_map, strict=True):
            part.append(values)
    params_, scalars, tmaps = (np.concatenate(part).astype(np.int64) for part in maps)
    return jax.ffi.ffi_call(TARGET, out_shape, input_output_aliases=aliases or None)(
        *arrays, cubin=np.concatenate(cubins), names=" ".join(names),
        kernels=np.array(rows, np.int64), params=params_, scalars=scalars, tmaps=tmaps)
