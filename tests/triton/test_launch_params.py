"""``launch_params.h``, the packing both launch libraries share (XLA's custom call and the eager
native launcher), on CPU: a small library built here around ``woa::PackParams`` with a stand-in
for ``cuTensorMapEncodeTiled`` shows what each kernel parameter receives, for the parameter
maps ``xla_ffi.params`` writes, and a stand-in for ``cuLaunchKernelEx`` shows what
``woa::LaunchStep`` asks the driver for."""

from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest

from torch_bridge.backends.triton import native_build, xla_ffi

_SHIM = r"""
#include <cstddef>
#include <cstring>
#include "launch_params.h"

namespace {
int64_t* encode_log = nullptr;
int encodes = 0;
int encode_result = 0;

// Records its arguments (12 values per call) and marks the map with the call's number.
int FakeEncode(woa::TensorMap* map, int dtype, unsigned rank, void* base, const uint64_t* dims,
               const uint64_t* strides, const unsigned* box, const unsigned* element_strides,
               int interleave, int swizzle, int l2, int fill) {
  int64_t* row = encode_log + 12 * encodes++;
  const int64_t values[12] = {dtype, rank, (int64_t)(uintptr_t)base, (int64_t)dims[0],
                              rank > 1 ? (int64_t)dims[1] : -1,
                              rank > 1 ? (int64_t)strides[0] : -1, box[0],
                              rank > 1 ? (int64_t)box[1] : -1, element_strides[0],
                              interleave * 1000 + swizzle, l2, fill};
  std::memcpy(row, values, sizeof(values));
  map->opaque[0] = 0xC0DE0000u + encodes;
  return encode_result;
}
}  // namespace

extern "C" int pack(const int64_t* params, int64_t n, const int64_t* scalars, int64_t ns,
                    const int64_t* tmaps, int64_t nt, const uint64_t* operands,
                    int64_t n_operands, int result, uint64_t* values, int64_t* log,
                    int64_t* cuda_error) {
  encode_log = log;
  encodes = 0;
  encode_result = result;
  auto operand = [&](int64_t i, void** address) {
    if (i < 0 || i >= n_operands) return false;
    *address = reinterpret_cast<void*>(operands[i]);
    return true;
  };
  woa::Packed packed;
  woa::PackError e = woa::PackParams(params, n, scalars, ns, tmaps, nt, FakeEncode, operand,
                                     &packed);
  *cuda_error = packed.cuda_error;
  if (e != woa::PackError::kNone) return static_cast<int>(e);
  // What each parameter's pointer reads: a slot's value, or a map's first word.
  for (int64_t i = 0; i < n + static_cast<int64_t>(woa::kSpareSlots); ++i) {
    values[i] = *static_cast<uint64_t*>(packed.pointers[i]);
  }
  return 0;
}

namespace {
int64_t* launch_log = nullptr;
CUresult launch_result = CUDA_SUCCESS;

// Records the launch's shape, stream, attributes and first parameter (8 values).
CUresult FakeLaunch(const CUlaunchConfig* config, CUfunction fn, void** params, void** extra) {
  const bool one = config->numAttrs == 1;
  const int64_t values[8] = {
      (int64_t)config->gridDimX * 10000 + config->gridDimY * 100 + config->gridDimZ,
      config->blockDimX * 1000 + config->blockDimY * 10 + config->blockDimZ,
      config->sharedMemBytes, (int64_t)(uintptr_t)config->hStream, config->numAttrs,
      one ? (int64_t)config->attrs[0].id : -1,
      one ? (int64_t)config->attrs[0].value.programmaticStreamSerializationAllowed : -1,
      (int64_t)*static_cast<uint64_t*>(params[0]) + (extra == nullptr ? 0 : 1)};
  std::memcpy(launch_log, values, sizeof(values));
  return launch_result;
}
}  // namespace

extern "C" int launch(const int64_t* params, int64_t n, uint64_t operand0, int pdl, int result,
                      int64_t* log, int64_t* cuda) {
  launch_log = log;
  launch_result = static_cast<CUresult>(result);
  const woa::Step step = {nullptr, {3, 2, 1}, 128, 4096, pdl != 0, params,
                          static_cast<size_t>(n), nullptr, 0, nullptr, 0};
  auto operand = [&](int64_t i, void** address) {
    if (i != 0) return false;
    *address = reinterpret_cast<void*>(operand0);
    return true;
  };
  woa::LaunchResult done = woa::LaunchStep(FakeLaunch, FakeEncode, step,
                                           reinterpret_cast<CUstream>(0x5000), operand);
  *cuda = done.cuda;
  return static_cast<int>(done.packing);
}

// woa::Step's size, then each field's offset, in declaration order.
extern "C" void step_layout(int64_t* out) {
  const int64_t values[12] = {
      sizeof(woa::Step), offsetof(woa::Step, function), offsetof(woa::Step, grid),
      offsetof(woa::Step, threads), offsetof(woa::Step, shared), offsetof(woa::Step, pdl),
      offsetof(woa::Step, params), offsetof(woa::Step, n_params), offsetof(woa::Step, scalars),
      offsetof(woa::Step, n_scalars), offsetof(woa::Step, tmaps), offsetof(woa::Step, n_tmaps)};
  std::memcpy(out, values, sizeof(values));
}
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    cxx = native_build.compiler()
    if cxx is None:
        pytest.skip("no C++ compiler to build the packing shim")
    out = tmp_path_factory.mktemp("shim")
    source = out / "shim.cc"
    source.write_text(_SHIM)
    lib = out / "shim.so"
    subprocess.run([cxx, "-O1", "-std=c++17", "-shared", "-fPIC", "-I",
                    str(native_build.SHARED_HEADER.parent), "-isystem",
                    str(native_build.cuda_include()), str(source), "-o", str(lib), "-ldl"],
                   check=True, capture_output=True)
    return ctypes.CDLL(str(lib))


def _pack(shim, args, tma=(), operands=(), result=0):
    return _pack_map(shim, *xla_ffi.params(args, tma), operands, result)


def _pack_map(shim, params, scalars, tmaps, operands=(), result=0):
    params, scalars, tmaps = (np.asarray(a, np.int64) for a in (params, scalars, tmaps))
    ops = np.array(operands or [0], np.uint64)
    values = np.zeros(len(params) + 4, np.uint64)
    log = np.zeros(12 * 4, np.int64)
    cuda_error = np.zeros(1, np.int64)
    code = shim.pack(
        params.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(len(params)),
        scalars.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(len(scalars)),
        tmaps.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(len(tmaps)),
        ops.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(len(operands)),
        ctypes.c_int(result), values.ctypes.data_as(ctypes.c_void_p),
        log.ctypes.data_as(ctypes.c_void_p), cuda_error.ctypes.data_as(ctypes.c_void_p))
    return code, values.tolist(), log.reshape(4, 12), int(cuda_error[0])


def test_pointers_and_scalars_fill_their_slots_and_triton_scratch_gets_null_slots(shim):
    code, values, _, _ = _pack(shim, (xla_ffi.Ref(1), 7, 2**40, 1, xla_ffi.Ref(0)),
                               operands=(0x1000, 0x2000))
    assert code == 0
    # The 1 is left out (Triton makes it a constexpr); four spare null slots follow.
    assert values == [0x2000, 7, 2**40, 0x1000, 0, 0, 0, 0]


def test_a_view_into_a_buffer_is_its_operand_plus_the_offset(shim):
    """A ``Ref`` with an offset (a piece of a call's scratch) packs as -3, its operand and
    offset among the scalars, and its slot holds the operand's address plus the offset."""
    args = (xla_ffi.Ref(1, 256, "int32"), 7, xla_ffi.Ref(0), xla_ffi.Ref(1, 4096))
    assert [a.tolist() for a in xla_ffi.params(args, ())[:2]] == [[-3, -1, 0, -3],
                                                                  [1, 256, 7, 1, 4096]]
    code, values, _, _ = _pack(shim, args, operands=(0x1000, 0x20000))
    assert code == 0 and values[:4] == [0x20100, 7, 0x1000, 0x21000]
    assert _pack_map(shim, [-3], [1], [], operands=(1, 2))[0] == 2  # kTooFewScalars
    assert _pack_map(shim, [-3], [5, 0], [], operands=(1, 2))[0] == 5  # kOperand
    with pytest.raises(ValueError, match="multiple of 16"):
        xla_ffi.Ref(0, 8)


def test_a_descriptor_is_its_tensor_map_then_its_shape_and_strides(shim):
    # x [64, 8192] fp8 viewed in [64, 128] boxes, row stride 8192: Triton's encoding
    # (CUtensorMapDataType 0 = uint8, 1 byte, 128B swizzle = 3).
    desc = xla_ffi.Desc(0, (64, 8192), 8192, (64, 128), None)
    code, values, log, _ = _pack(shim, (desc, xla_ffi.Ref(1)), tma=((0, 1, 3, (64, 128)),),
                                 operands=(0x10000, 0x20000))
    assert code == 0
    assert values[0] == 0xC0DE0001  # the map
    assert values[1:5] == [64, 8192, 8192, 1]  # shape (i32), row strides (i64)
    assert values[5] == 0x20000
    dtype, rank, base, d0, d1, stride, box0, box1, elem, swizzle, l2, fill = log[0]
    assert (dtype, rank, base) == (0, 2, 0x10000)
    assert (d0, d1, stride) == (8192, 64, 8192)  # innermost first, byte strides
    assert (box0, box1, elem, swizzle, l2, fill) == (128, 64, 1, 3, 2, 0)


def test_byte_strides_scale_with_the_element_size(shim):
    # y [16, 2048] bf16 (2 bytes) in [16, 64] boxes, row stride 2048 elements.
    desc = xla_ffi.Desc(0, (16, 2048), 2048, (16, 64), None)
    code, _, log, _ = _pack(shim, (desc,), tma=((10, 2, 3, (16, 64)),), operands=(0x40,))
    assert code == 0 and log[0][5] == 4096


def test_errors_name_what_is_missing(shim):
    assert _pack(shim, (xla_ffi.Ref(3),), operands=(1,))[0] == 5  # kOperand
    assert _pack_map(shim, [-2], [], [], operands=(1,))[0] == 3  # kTooFewTensorMaps
    assert _pack_map(shim, [-1, -1], [5], [])[0] == 2  # kTooFewScalars
    desc = xla_ffi.Desc(0, (8, 128), 128, (8, 128), None)
    code, _, _, cuda_error = _pack(shim, (desc,), tma=((0, 1, 3, (8, 128)),), operands=(1,),
                                   result=700)
    assert (code, cuda_error) == (6, 700)  # kEncode, with the driver's error
    assert _pack(shim, tuple(range(2, 70)))[0] == 1  # kTooManyParams


def _launch(shim, params, pdl, result=0):
    params = np.asarray(params, np.int64)
    log = np.full(8, -9, np.int64)
    cuda = np.zeros(1, np.int64)
    code = shim.launch(params.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(len(params)),
                       ctypes.c_uint64(0xABC0), ctypes.c_int(pdl), ctypes.c_int(result),
                       log.ctypes.data_as(ctypes.c_void_p), cuda.ctypes.data_as(ctypes.c_void_p))
    return code, int(cuda[0]), log.tolist()


@pytest.mark.parametrize("pdl", [True, False])
def test_a_step_launches_with_its_shape_and_programmatic_only_when_asked(shim, pdl):
    code, cuda, log = _launch(shim, [0], pdl)
    assert (code, cuda) == (0, 0)
    grid, block, shared, stream, n_attrs, attr, allowed, first = log
    assert (grid, block, shared, stream, first) == (30201, 128011, 4096, 0x5000, 0xABC0)
    # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION is 6 in the driver API.
    assert (n_attrs, attr, allowed) == ((1, 6, 1) if pdl else (0, -1, -1))


def test_a_step_reports_the_launch_error_or_the_packing_error(shim):
    assert _launch(shim, [0], True, result=719)[:2] == (0, 719)
    code, _, log = _launch(shim, [1], True)  # no operand 1: nothing is launched
    assert code == 5 and log[0] == -9  # kOperand


def test_the_eager_launchers_steps_have_woa_steps_layout(shim):
    """``native._Step`` (ctypes) is ``woa::Step`` byte for byte: ``woa_native_launch`` reads
    the array ``native`` builds as ``woa::Step``s."""
    from torch_bridge.backends.triton import native

    layout = np.zeros(12, np.int64)
    shim.step_layout(layout.ctypes.data_as(ctypes.c_void_p))
    offsets = [getattr(native._Step, name).offset for name, _ in native._Step._fields_]
    assert [ctypes.sizeof(native._Step), *offsets] == layout.tolist()
