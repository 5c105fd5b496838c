"""What the torch launchers share: custom-op registration, the eager fast path, layout helpers.

The ops mutate preallocated outputs and return nothing, so ``torch.compile`` sees opaque calls
(no stride baking) and CUDA-graph capture sees fixed buffers: the launchers allocate nothing when
outputs are given (except split-K's fp32 parts, which a capture takes from its private pool),
never synchronise, and read int32 or int64 positions directly (no ``.to(int64)`` copy).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading

import torch

from ..._capability import interpreter_on
from . import configs

LIB = "woa_triton"


def launcher_op(name: str, mutates_args: tuple[str, ...]):
    """Register a launch function as the custom op ``woa_triton::name`` (opaque to
    ``torch.compile`` and fake tensors, which see no effect beyond the mutated outputs), with
    the function kept as its ``launch_fn`` for plain eager calls."""
    def register(fn):
        op = torch.library.custom_op(f"{LIB}::{name}", mutates_args=mutates_args)(fn)

        @op.register_fake
        def _(*args, **kwargs) -> None:
            return None

        op.launch_fn = fn
        return op
    return register


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_PLAIN_TYPES = frozenset(_PLAIN_TENSORS)


def _plain_eager(args) -> bool:
    """No dispatch mode (fake tensors, ``make_fx``), functorch transform or tensor subclass is
    in play: the op's dispatch would only reach the launch function."""
    return (torch._C._len_torch_dispatch_stack() == 0
            and not torch._C._are_functorch_transforms_active()
            and all(type(a) in _PLAIN_TENSORS for a in args if isinstance(a, torch.Tensor)))


def run_mutating(op, mutated: tuple[torch.Tensor, ...], *args) -> None:
    """Call a launcher op that writes ``mutated`` in place, with as little host time as it can.

    Eager with plain tensors, the launch function runs directly: the custom op's dispatch costs
    more host time than the launch itself. The version counters of ``mutated`` are bumped
    here, so autograd's in-place checks keep working. Anything else (``torch.compile``, fake
    tensors, functorch, subclasses) goes through the op, which has fake implementations.
    """
    if torch.compiler.is_compiling():
        op(*args)
        return
    launch_fn = getattr(op, "launch_fn", None)
    if launch_fn is not None and _plain_eager(args):
        launch_fn(*args)
    else:
        with torch._C._AutoDispatchBelowADInplaceOrView():
            op(*args)
    torch.autograd.graph.increment_version(mutated)


def run_direct(fn, mutated: tuple[torch.Tensor, ...], *args) -> None:
    """Call a launch function that no custom op wraps, for operands an op does not declare
    (memory its caller owns, such as XLA's buffers on ``jax_ops``' callback route).

    Plain eager calls only: ``torch.compile`` and fake tensors could not see its writes.
    """
    if torch.compiler.is_compiling() or not _plain_eager(args):
        raise ValueError("caller-owned scratch is for plain eager calls; under torch.compile, "
                         "fake tensors or tensor subclasses leave it out (the op takes its own)")
    fn(*args)
    torch.autograd.graph.increment_version(mutated)


def signature(t: torch.Tensor) -> tuple:
    """What a launch plan may depend on in a tensor: shape, strides, dtype, device."""
    return t.shape, t.stride(), t.dtype, t.device


_SAME_DEVICE = contextlib.nullcontext()


def on_device_of(t: torch.Tensor):
    """Triton launches on torch's current CUDA device: make it the operands' (a no-op when it
    already is, and for the interpreter's CPU tensors), with its context current in this
    thread (``context_current``)."""
    if not t.is_cuda:
        return _SAME_DEVICE
    if t.device.index == torch.cuda.current_device():
        context_current(t.device.index)
        return _SAME_DEVICE
    return torch.cuda.device(t.device)  # setting the device makes its context current


_THREAD = threading.local()


def context_current(device: int) -> None:
    """Make ``device``'s CUDA context current in this thread, once per thread and device.

    Launches and TMA descriptor encodings go through the driver, which needs a current context;
    a thread whose first CUDA work is one of ours (on a stream made elsewhere) has none until a
    runtime call binds the device's primary context."""
    ready = getattr(_THREAD, "devices", None)
    if ready is None:
        ready = _THREAD.devices = set()
    if device not in ready:
        torch.cuda.is_current_stream_capturing()  # a runtime call: binds the context
        ready.add(device)


#: The Triton releases (major, minor) whose private launch layout the direct launches call:
#: ``CompiledKernel.run``'s arguments, ``CudaLauncher``'s C launch and its descriptor step.
DIRECT_LAUNCH_TRITON = ((3, 6), (3, 9))


@functools.cache
def direct_launches() -> tuple[bool, str]:
    """Whether repeated launches may call compiled kernels through Triton's private launch
    layout (``Launch``'s repeats, ``Bound``, ``gemm.WgmmaBound``): ``(ok, reason)``.

    Only the tested releases (``DIRECT_LAUNCH_TRITON``) do, unless ``WOA_DIRECT_LAUNCH=0``;
    any other Triton takes ``kernel[grid](...)``, its public launch, on every call: more host
    time per call, the same kernels and bits.
    """
    from ... import _capability

    if not _capability.env_flag("WOA_DIRECT_LAUNCH", True):
        return False, "disabled by WOA_DIRECT_LAUNCH=0"
    import triton

    version = triton.__version__
    try:
        release = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        release = None
    low, high = DIRECT_LAUNCH_TRITON
    if release is None or not low <= release <= high:
        return False, (f"Triton {version} is outside the releases whose launch layout is known "
                       f"({low[0]}.{low[1]} to {high[0]}.{high[1]}): Triton's public launch")
    return True, f"Triton {version}"


def _specialization(a) -> object:
    """What Triton specializes a runtime argument on: a tensor's dtype and 16-byte alignment, an
    integer's value class (1, a multiple of 16, 32 or 64 bits), anything else's type."""
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    if type(a) is int:
        return a == 1, a % 16 == 0, -2**31 <= a < 2**31
    return type(a)


#: Every launch signature met so far (``launch_for``), bounded: every token count is one.
LAUNCHES: dict[tuple, Launch] = {}
_MAX_LAUNCHES = 4096


def launch_for(key: tuple, make) -> Launch:
    """The launch of one call signature: ``make()`` on first sight, then kept.

    ``key`` holds everything the launch depends on (the kernel's name, shapes, strides, dtypes,
    device and options), so a repeated call pays a dict lookup instead of the launch rules.
    """
    found = LAUNCHES.get(key)
    if found is None:
        if len(LAUNCHES) >= _MAX_LAUNCHES:
            LAUNCHES.clear()
        found = LAUNCHES[key] = make()
    return found


class Launch:
    """One kernel at one launch signature (``plans.Plan``), the one object every path uses: the
    custom op, its eager repeats (``bind``) and CUDA-graph capture.

    ``__call__(args)`` is ``kernel[grid](*args, **constexprs)`` on the current stream. Triton's
    own launch re-derives the specialization from every argument on each call, several times
    the launch's host cost; a repeat of a compiled specialization (``_specialization`` of each
    runtime argument) launches the compiled kernel directly. The interpreter, and a Triton
    without ``direct_launches``, always take Triton's path. ``extra``: what the op's launcher
    keeps beside the plan (the wgmma GEMM's descriptor views).
    """

    __slots__ = ("plan", "kernel", "grid", "options", "extra", "_compiled")

    def __init__(self, plan, extra=None):
        self.plan, self.kernel, self.grid = plan, plan.kernel, plan.grid
        self.options = plan.compile_options()
        self.extra = extra
        self._compiled: dict[tuple, tuple] = {}

    def __call__(self, args: tuple) -> None:
        if interpreter_on() or not direct_launches()[0]:
            self.kernel[self.grid](*args, **self.options)
            return
        spec = tuple(map(_specialization, args))
        found = self._compiled.get(spec)
        if found is None:
            compiled = self.kernel[self.grid](*args, **self.options)
            tail = tuple(self.options[p.name] if p.name in self.options else p.default
                         for p in self.kernel.params[len(args):])
            self._compiled[spec] = (compiled, tail)
            return
        compiled, tail = found
        _run_compiled(compiled, self.grid, (*args, *tail))

    def compiled(self, args: tuple):
        """The compiled kernel of ``args``' specialization, once launched, else ``None``."""
        found = self._compiled.get(tuple(map(_specialization, args)))
        return None if found is None else found[0]

    def bind(self, args: tuple, slots: tuple[int, ...], stream: int | None = None,
             checked: int | None = None) -> Bound | None:
        """This launch's compiled kernel for ``args``, bound with the tensors at ``slots`` left
        open (``stream``, ``checked``: see ``Bound``); ``None`` before its first launch of that
        specialization, under the interpreter or without ``direct_launches``."""
        if not direct_launches()[0]:
            return None
        found = self._compiled.get(tuple(map(_specialization, args)))
        if found is None:
            return None
        return Bound(found[0], found[1], self.grid, args, slots, stream, checked)


def current_stream(device: int | None = None) -> int:
    """The current stream of ``device`` (default: the current device), as Triton's launcher
    takes it."""
    return _stream_getter()(torch.cuda.current_device() if device is None else device)


@functools.cache
def _stream_getter():
    from triton.runtime.driver import driver

    return driver.active.get_current_stream


def eager_stream(tensors: tuple, device: int | None, pinned: int | None = None) -> int | None:
    """The stream a bound launch (``Bound``, ``gemm.WgmmaBound``) may launch on now, else
    ``None``: ``torch.compile``, a dispatch mode, functorch or a tensor subclass is in play,
    another device is current, or, for a launch whose scratch belongs to stream ``pinned``,
    another stream is current or it is being captured (a captured launch would share that
    scratch with eager ones)."""
    if (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack()
            or torch._C._are_functorch_transforms_active()
            or not _PLAIN_TYPES.issuperset(map(type, tensors))):
        return None
    current = torch.cuda.current_device()
    if current != device:
        return None
    context_current(current)
    stream = current_stream(current)
    if pinned is not None and (stream != pinned or torch.cuda.is_current_stream_capturing()):
        return None
    return stream


#: Bytes of the buffers kept for one stream and problem (``stream_buffers``): every decode
#: batch's quantized activations (2048 tokens at G = 2, 256 at G = 16) or rotated tails fit;
#: larger calls allocate their own, as their GPU time hides the allocation.
SCRATCH_BYTES = 16 << 20


@dataclasses.dataclass(frozen=True)
class StreamBuffers:
    """Buffers that one stream's direct launches write and read back, kept across calls, so a
    host-bound call allocates only its output. ``lock`` is held from a call's first launch to
    its last, so that two threads on one stream cannot launch a second writer into the buffers
    before the first call's reader is queued."""

    tensors: tuple[torch.Tensor, ...]
    lock: threading.Lock


_KEPT: dict[tuple, StreamBuffers] = {}
_KEPT_LOCK = threading.Lock()


def stream_buffers(key: tuple, make) -> StreamBuffers:
    """The buffers kept under ``key`` (it names the device and stream, and whatever fixes their
    shapes): ``make()``'s tensors, made on first use and kept for the process."""
    with _KEPT_LOCK:
        found = _KEPT.get(key)
        if found is None:
            found = _KEPT[key] = StreamBuffers(tuple(make()), threading.Lock())
    return found


class Bound:
    """One launch signature's compiled kernel, bound to everything but its tensors.

    ``__call__(tensors)`` launches it with ``tensors`` in the places they had when it was bound
    (the other arguments fixed), or returns ``False`` without launching when the call needs
    the op's own path (``eager_stream`` says when; also when an input's 16-byte alignment
    differs). The first ``checked`` tensors are the call's inputs; the others are the caller's
    own: tensors it keeps (tables, weights, scratch for stream ``stream``) or outputs made for
    the call (no version counter is bumped). Callers check the rest (shapes, strides, dtypes,
    device) with their plan key.
    """

    __slots__ = ("_go", "_grid", "_template", "_slots", "_checked", "_aligned", "_device",
                 "_stream")

    def __init__(self, compiled, tail: tuple, grid: tuple[int, ...], args: tuple,
                 slots: tuple[int, ...], stream: int | None = None, checked: int | None = None):
        if any(isinstance(a, torch.Tensor) for i, a in enumerate(args) if i not in slots):
            raise ValueError("Bound: every tensor argument must be in a slot")
        self._go = raw_launch(compiled) or triton_launch(compiled)
        self._grid = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
        # No tensor of the binding call is kept: a prefill's o would stay alive with it.
        self._template = [None if i in slots else a for i, a in enumerate(args)] + list(tail)
        self._slots = slots
        self._checked = len(slots) if checked is None else checked
        self._aligned = tuple(args[i].data_ptr() % 16 == 0 for i in slots[:self._checked])
        self._device = args[slots[0]].device.index
        self._stream = stream

    def __call__(self, tensors: tuple) -> bool:
        stream = eager_stream(tensors[:self._checked], self._device, self._stream)
        if stream is None:
            return False
        addresses = tuple(map(_DATA_PTR, tensors))
        if tuple(p % 16 == 0 for p in addresses[:self._checked]) != self._aligned:
            return False
        enter, leave, wanted = launch_hooks()
        ordered = self._template.copy()
        # Addresses, not tensors, unless a hook reads the launch's arguments: Triton's C
        # launch takes an integer as the address itself, where a tensor costs it a method
        # call and a driver query (cuPointerGetAttribute) per argument.
        for i, a in zip(self._slots, tensors if wanted else addresses, strict=True):
            ordered[i] = a
        self._go(*self._grid, stream, ordered, enter, leave, wanted)
        return True


_DATA_PTR = torch.Tensor.data_ptr


@functools.cache
def _runtime_knobs():
    """Triton's runtime knobs (the profiler hooks are read from them on every launch)."""
    from triton import knobs

    return knobs.runtime


def _hooked(hook) -> bool:
    """Whether a Triton launch hook calls anything (an empty ``HookChain`` does not)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def launch_hooks() -> tuple[object, object, bool]:
    """Triton's ``(launch_enter_hook, launch_exit_hook, metadata wanted)`` for one launch.

    Triton (3.6 to 3.9) keeps an empty ``HookChain`` in each knob, builds its launch metadata
    whenever the enter knob is not ``None`` and has its C launcher call both chains. Here an
    empty chain is passed as ``None`` (it would do nothing) and the metadata is built only
    when a hook would read it.
    """
    knobs = _runtime_knobs()
    enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
    entering, leaving = _hooked(enter), _hooked(leave)
    return (enter if entering else None, leave if leaving else None,
            enter is not None and (entering or leaving))


def _run_compiled(compiled, grid: tuple[int, ...], ordered) -> None:
    """The launch step of Triton's own path (3.6 to 3.9) on the current stream, profiler hooks
    included."""
    enter, leave, wanted = launch_hooks()
    triton_launch(compiled)(grid[0], grid[1] if len(grid) > 1 else 1,
                            grid[2] if len(grid) > 2 else 1, current_stream(), ordered, enter,
                            leave, wanted)


def triton_launch(compiled, run=None):
    """``go(gx, gy, gz, stream, args, enter, leave, wanted)`` through Triton's own launcher
    (``run``: a stand-in for ``compiled.run``, as ``descriptor_launcher`` makes)."""
    run = run or compiled.run

    def go(gx, gy, gz, stream, args, enter, leave, wanted):
        run(gx, gy, gz, stream, compiled.function, compiled.packed_metadata,
            compiled.launch_metadata((gx, gy, gz), stream, *args) if wanted else None,
            enter, leave, *args)
    return go


def raw_launch(compiled, run=None):
    """``go(gx, gy, gz, stream, args, enter, leave, wanted)``: the compiled kernel's C launch
    called directly, without the Python step of Triton's launcher, else ``None``.

    Triton's ``CudaLauncher.__call__`` first allocates the kernel's global and profile scratch;
    for a kernel that needs neither (and no sanitizer) the step only passes ``None`` for both,
    at a cost an eager call feels. Two layouts of the C launch are known: Triton
    3.6 (the kernel's arguments spread out after the scratch) and 3.7 to 3.9 (scratch, argument
    annotations, kernel signature, then the arguments as one tuple); any other launcher, or a
    kernel with scratch, gets ``None`` and callers keep Triton's path. ``run``: as for
    ``triton_launch``.
    """
    run = run or compiled.run
    code = getattr(type(run).__call__, "__code__", None)
    if (type(run).__name__ != "CudaLauncher" or code is None
            or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1)
            or getattr(run, "gsan_enabled", False)):
        return None
    c_launch, coop, pdl = run.launch, run.launch_cooperative_grid, run.launch_pdl
    function, packed = compiled.function, compiled.packed_metadata
    meta = compiled.launch_metadata
    if code.co_argcount == 10 and hasattr(run, "arg_annotations"):  # 3.7 to 3.9
        annotations, signature = run.arg_annotations, run.kernel_signature

        def go(gx, gy, gz, stream, args, enter, leave, wanted):
            c_launch(gx, gy, gz, stream, function, coop, pdl, packed,
                     meta((gx, gy, gz), stream, *args) if wanted else None, enter, leave,
                     None, None, annotations, signature, tuple(args))
        return go
    if code.co_argcount == 6 and not hasattr(run, "arg_annotations"):  # 3.6
        def go(gx, gy, gz, stream, args, enter, leave, wanted):
            c_launch(gx, gy, gz, stream, function, coop, pdl, None, None, packed,
                     meta((gx, gy, gz), stream, *args) if wanted else None, enter, leave, *args)
        return go
    return None


def descriptor_launcher(compiled):
    """``(run, expand)`` for a compiled kernel with tensor-descriptor arguments, or ``None``
    where this Triton's launcher is not the one known here.

    Triton's launcher (3.6 to 3.9) wraps its C launch in a step that expands every descriptor
    argument into ``[CUtensorMap, *shape, *strides]``, building the CUtensorMap on each launch
    (``make_tensordesc_arg``). ``run`` is a copy of ``compiled.run`` without that step, called
    like ``compiled.run`` with each descriptor already expanded; ``expand(i, desc)`` is the step
    for the kernel's ``i``-th descriptor. A CUtensorMap depends only on the base address, shape,
    strides, tile and dtype, so callers may keep expansions and pass them again.
    """
    import copy
    import inspect

    from triton.backends.nvidia import driver as nvidia

    wrapped = getattr(compiled.run, "launch", None)
    code = getattr(wrapped, "__code__", None)
    metas = getattr(compiled.metadata, "tensordesc_meta", None)
    make = getattr(nvidia, "make_tensordesc_arg", None)
    if code is None or "launcher" not in code.co_freevars or not metas or make is None:
        return None
    run = copy.copy(compiled.run)
    run.launch = wrapped.__closure__[code.co_freevars.index("launcher")].cell_contents
    extra = (None,) * (len(inspect.signature(make).parameters) - 2)  # 3.9 takes a third

    def expand(i: int, desc) -> list:
        return make(desc, metas[i], *extra)
    return run, expand


def rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def last_dims_contiguous(o: torch.Tensor) -> torch.Tensor:
    """``o [S, H, Dh]`` with (H, Dh) packed; the token stride may be anything."""
    if o.stride(2) == 1 and o.stride(1) == o.shape[2]:
        return o
    return o.contiguous()


def output(out: torch.Tensor | None, shape: tuple[int, int, int], dtype: torch.dtype,
           device: torch.device) -> torch.Tensor:
    """A GEMM's ``[M, G, N]`` output: ``out`` checked (N contiguous), or a new tensor."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if tuple(out.shape) != shape or out.stride(2) != 1:
        raise ValueError(f"out must be [M, G, N] = {list(shape)} with N contiguous, got shape "
                         f"{list(out.shape)} strides {list(out.stride())}")
    return out


def target() -> str:
    """What compiles the kernels: ``"interpreter"`` (``TRITON_INTERPRET=1``), ``"hip"`` or
    ``"cuda"``."""
    if interpreter_on():
        return "interpreter"
    return "hip" if torch.version.hip is not None else "cuda"


#: ``pdl_capable``, ``pdl`` and ``chain_pdl`` per (question, device index): asked on every
#: chain call, so ``WOA_PDL`` is read once (a plain dict: ``functools.cache`` would make Dynamo
#: warn under ``torch.compile``; ``Backend.cache_clear`` empties it).
_PDL: dict[tuple[str, int | None], bool] = {}


def pdl_capable(device_index: int | None) -> bool:
    """Whether this device takes programmatic dependent launches (``plans.pdl_launches``)."""
    found = _PDL.get(("capable", device_index))
    if found is None:
        from . import plans

        found = target() == "cuda"
        if found:
            major, minor = torch.cuda.get_device_capability(device_index)
            found = plans.pdl_launches("cuda", 10 * major + minor)
        _PDL[("capable", device_index)] = found
    return found


def pdl(device_index: int | None, requested: bool = False) -> bool:
    """Whether a quant or pointer GEMM launches as a programmatic dependent launch, on a device
    that takes them (``pdl_capable``): where its launch shape asks (``requested``) unless
    ``WOA_PDL=0``, and every one with ``WOA_PDL=1``."""
    return _pdl_switch("every", False, device_index) or (requested and chain_pdl(device_index))


def chain_pdl(device_index: int | None) -> bool:
    """Whether launch shapes that ask for a programmatic dependent launch get one (the quant's,
    the FP8 chain's wgmma GEMM, ``gemm.chain_dependent``): by default on a device that takes
    them; ``WOA_PDL=0`` turns them off."""
    return _pdl_switch("chain", True, device_index)


def _pdl_switch(question: str, default: bool, device_index: int | None) -> bool:
    found = _PDL.get((question, device_index))
    if found is None:
        from ... import _capability

        found = _PDL[(question, device_index)] = (
            _capability.env_flag("WOA_PDL", default) and pdl_capable(device_index))
    return found


def dtype_name(dtype: torch.dtype) -> str:
    """A torch dtype's name as ``configs`` and ``plans`` take it (``"float8_e4m3fn"``)."""
    return str(dtype).removeprefix("torch.")


def hw_fp8_cast(fp8_dtype: torch.dtype) -> bool:
    """``configs.hw_fp8_cast`` for ``fp8_dtype`` on this process's target."""
    return configs.hw_fp8_cast(str(fp8_dtype).removeprefix("torch."), target())
