// XLA FFI handler that launches a compiled Triton kernel (a cubin) on XLA's CUDA stream.
//
// torch_bridge/backends/triton/xla_ffi.py builds this file on first use and registers, as the
// custom call target "woa_triton_launch", two stages: WoaTritonLoad (initialize: load the
// module) and WoaTritonLaunch (execute: launch it). Each call site carries its kernel as
// attributes (cubin bytes, entry name, launch shape, parameter map), so a compiled executable is
// self-contained; a module is loaded once per (kernel, CUDA context), and a call costs a map
// lookup, the encoding of its TMA descriptors (if any) for this call's buffers, and one
// cuLaunchKernel. The CUDA driver is opened with dlopen, so building needs only a C++17
// compiler and XLA's FFI headers.
//
// Command buffers: the execute handler carries Traits::kCmdBufferCompatible, which is how XLA
// learns that it may record the call into a CUDA graph (the GPU plugin takes no traits at
// registration). XLA traces the execute stage under stream capture, where loading a module is
// not stream work and must not happen; it runs the initialize stage outside capture first.

#include <dlfcn.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using CUresult = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;

constexpr int kMaxDynamicSharedSizeBytes = 8;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int64_t kDefaultSharedLimit = 48 * 1024;
// Parameters beyond the kernel's own are ignored by cuLaunchKernel; Triton appends up to two
// scratch pointers (unused by the kernels launched here), which get these null slots.
constexpr size_t kSpareSlots = 4;
constexpr size_t kMaxParams = 64;
constexpr size_t kMaxTensorMaps = 4;
// One row of the `tmaps` attribute: operand, CUtensorMapDataType, element bytes, swizzle
// (CUtensorMapSwizzle), NaN padding (0/1), rank (<= 2 here), box[2], shape[2], row stride in
// elements (outermost first, as Triton's host descriptors list them).
constexpr size_t kTensorMapRow = 12;
constexpr int kL2Promotion128B = 2;  // CU_TENSOR_MAP_L2_PROMOTION_L2_128B, as Triton encodes

struct alignas(64) TensorMap {
  uint64_t opaque[16];  // CUtensorMap
};

struct Driver {
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*module_load_data)(CUmodule*, const void*) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*func_set_attribute)(CUfunction, int, int) = nullptr;
  CUresult (*stream_is_capturing)(CUstream, int*) = nullptr;
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, unsigned, CUstream, void**, void**) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
  CUresult (*encode_tiled)(TensorMap*, int, unsigned, void*, const uint64_t*, const uint64_t*,
                           const unsigned*, const unsigned*, int, int, int, int) = nullptr;
  std::string error;
};

template <typename F>
void Resolve(void* lib, const char* name, F& fn, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr && error.empty()) error = std::string("libcuda.so.1 has no ") + name;
}

const Driver& GetDriver() {
  static const Driver driver = [] {
    Driver d;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      d.error = std::string("cannot open libcuda.so.1: ") + dlerror();
      return d;
    }
    Resolve(lib, "cuCtxGetCurrent", d.ctx_get_current, d.error);
    Resolve(lib, "cuModuleLoadData", d.module_load_data, d.error);
    Resolve(lib, "cuModuleGetFunction", d.module_get_function, d.error);
    Resolve(lib, "cuFuncSetAttribute", d.func_set_attribute, d.error);
    Resolve(lib, "cuStreamIsCapturing", d.stream_is_capturing, d.error);
    Resolve(lib, "cuLaunchKernel", d.launch_kernel, d.error);
    Resolve(lib, "cuGetErrorString", d.get_error_string, d.error);
    Resolve(lib, "cuTensorMapEncodeTiled", d.encode_tiled, d.error);
    return d;
  }();
  return driver;
}

ffi::Error CudaError(const Driver& d, CUresult rc, std::string_view what) {
  const char* text = nullptr;
  d.get_error_string(rc, &text);
  return ffi::Error::Internal("woa_triton_launch: " + std::string(what) + " failed: " +
                              (text != nullptr ? text : std::to_string(rc)));
}

// Loaded kernels, keyed by content (the digest the lowering computed from the cubin bytes, the
// cubin's size, the entry name) and CUDA context, never by attribute address: XLA may hand a
// call site's attributes at a new address on every (re)record of a command buffer.
using KernelKey = std::tuple<int64_t, size_t, CUcontext>;
struct Loaded {
  std::string name;
  CUfunction fn;
};
std::mutex kernels_mutex;
std::map<KernelKey, std::vector<Loaded>> kernels;

// The kernel's function in the key's context, or nullptr; the caller holds kernels_mutex.
CUfunction FindLoaded(const KernelKey& key, std::string_view name) {
  auto it = kernels.find(key);
  if (it == kernels.end()) return nullptr;
  for (const Loaded& k : it->second) {
    if (k.name == name) return k.fn;
  }
  return nullptr;
}

ffi::ErrorOr<CUcontext> CurrentContext(const Driver& d) {
  CUcontext ctx = nullptr;
  if (CUresult rc = d.ctx_get_current(&ctx); rc != 0) {
    return ffi::Unexpected(CudaError(d, rc, "cuCtxGetCurrent"));
  }
  return ctx;
}

// Loads the kernel into the current context unless it is there already.
ffi::Error LoadFunction(const Driver& d, ffi::Span<const uint8_t> cubin, std::string_view name,
                        int64_t digest, int64_t shared) {
  auto ctx = CurrentContext(d);
  if (ctx.has_error()) return ctx.error();
  const KernelKey key(digest, cubin.size(), *ctx);
  std::lock_guard<std::mutex> lock(kernels_mutex);
  if (FindLoaded(key, name) != nullptr) return ffi::Error::Success();
  CUmodule module = nullptr;
  if (CUresult rc = d.module_load_data(&module, cubin.begin()); rc != 0) {
    return CudaError(d, rc, "cuModuleLoadData");
  }
  CUfunction fn = nullptr;
  if (CUresult rc = d.module_get_function(&fn, module, std::string(name).c_str()); rc != 0) {
    return CudaError(d, rc, "cuModuleGetFunction");
  }
  if (shared > kDefaultSharedLimit) {
    if (CUresult rc = d.func_set_attribute(fn, kMaxDynamicSharedSizeBytes,
                                           static_cast<int>(shared));
        rc != 0) {
      return CudaError(d, rc, "cuFuncSetAttribute");
    }
  }
  kernels[key].push_back(Loaded{std::string(name), fn});
  return ffi::Error::Success();
}

// The kernel's function for a launch on stream. A kernel not loaded yet is loaded here only
// when the stream is not being captured: under capture it means the initialize stage did not
// run, and loading a module there is not stream work, so it is an error.
ffi::Error GetFunction(const Driver& d, CUstream stream, ffi::Span<const uint8_t> cubin,
                       std::string_view name, int64_t digest, int64_t shared, CUfunction* fn) {
  auto ctx = CurrentContext(d);
  if (ctx.has_error()) return ctx.error();
  const KernelKey key(digest, cubin.size(), *ctx);
  {
    std::lock_guard<std::mutex> lock(kernels_mutex);
    *fn = FindLoaded(key, name);
  }
  if (*fn != nullptr) return ffi::Error::Success();
  int capturing = 0;  // CUstreamCaptureStatus: 0 none, 1 active, 2 invalidated
  if (CUresult rc = d.stream_is_capturing(stream, &capturing); rc != 0) {
    return CudaError(d, rc, "cuStreamIsCapturing");
  }
  if (capturing != 0) {
    return ffi::Error::Internal(
        "woa_triton_launch: kernel " + std::string(name) + " is not loaded and the stream is "
        "being captured into a command buffer: the initialize stage (WoaTritonLoad) did not "
        "run for this call; a module is never loaded under capture");
  }
  if (ffi::Error err = LoadFunction(d, cubin, name, digest, shared); err.failure()) return err;
  std::lock_guard<std::mutex> lock(kernels_mutex);
  *fn = FindLoaded(key, name);
  return ffi::Error::Success();
}

ffi::ErrorOr<void*> Operand(ffi::RemainingArgs& args, ffi::RemainingRets& rets, int64_t i) {
  if (static_cast<size_t>(i) < args.size()) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return ffi::Unexpected(buffer.error());
    return buffer->untyped_data();
  }
  auto buffer = rets.get<ffi::AnyBuffer>(i - args.size());
  if (buffer.has_error()) return ffi::Unexpected(buffer.error());
  return (*buffer)->untyped_data();
}

// Encodes a tiled TMA descriptor as Triton's launcher does (dims innermost first, byte strides).
ffi::Error EncodeTensorMap(const Driver& d, const int64_t* row, void* base, TensorMap* map) {
  const unsigned rank = static_cast<unsigned>(row[5]);
  if (rank < 1 || rank > 2) return ffi::Error::InvalidArgument("woa_triton_launch: TMA rank");
  uint64_t dims[2], strides[1] = {0};
  unsigned box[2], element_strides[2] = {1, 1};
  for (unsigned i = 0; i < rank; ++i) {
    dims[rank - 1 - i] = static_cast<uint64_t>(row[8 + i]);
    box[rank - 1 - i] = static_cast<unsigned>(row[6 + i]);
  }
  if (rank == 2) strides[0] = static_cast<uint64_t>(row[10] * row[2]);
  if (CUresult rc = d.encode_tiled(map, static_cast<int>(row[1]), rank, base, dims, strides, box,
                                   element_strides, 0, static_cast<int>(row[3]),
                                   kL2Promotion128B, static_cast<int>(row[4]));
      rc != 0) {
    return CudaError(d, rc, "cuTensorMapEncodeTiled");
  }
  return ffi::Error::Success();
}

// launch: {grid_x, grid_y, grid_z, threads per block, dynamic shared bytes}.
// params: one entry per kernel parameter: an operand index (inputs, then outputs) when >= 0,
// -1 for the next value of `scalars`, -2 for the next TMA descriptor of `tmaps` (passed by
// value; the shape and strides parameters that follow it are scalars).
ffi::Error Launch(CUstream stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                  ffi::Span<const uint8_t> cubin, std::string_view name, int64_t digest,
                  ffi::Span<const int64_t> launch, ffi::Span<const int64_t> params,
                  ffi::Span<const int64_t> scalars, ffi::Span<const int64_t> tmaps) {
  const Driver& d = GetDriver();
  if (!d.error.empty()) return ffi::Error::Internal("woa_triton_launch: " + d.error);
  if (launch.size() != 5 || params.size() > kMaxParams) {
    return ffi::Error::InvalidArgument("woa_triton_launch: malformed launch attributes");
  }
  CUfunction fn = nullptr;
  if (ffi::Error err = GetFunction(d, stream, cubin, name, digest, launch[4], &fn);
      err.failure()) {
    return err;
  }
  uint64_t slots[kMaxParams + kSpareSlots] = {};
  void* pointers[kMaxParams + kSpareSlots];
  TensorMap maps[kMaxTensorMaps];
  size_t next_scalar = 0, next_map = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t p = params[i];
    pointers[i] = &slots[i];
    if (p == -1) {
      if (next_scalar == scalars.size()) {
        return ffi::Error::InvalidArgument("woa_triton_launch: too few scalars");
      }
      slots[i] = static_cast<uint64_t>(scalars[next_scalar++]);
    } else if (p == -2) {
      if (next_map == kMaxTensorMaps || (next_map + 1) * kTensorMapRow > tmaps.size()) {
        return ffi::Error::InvalidArgument("woa_triton_launch: too few tensor maps");
      }
      const int64_t* row = tmaps.begin() + next_map * kTensorMapRow;
      auto base = Operand(args, rets, row[0]);
      if (base.has_error()) return base.error();
      if (ffi::Error err = EncodeTensorMap(d, row, *base, &maps[next_map]); err.failure()) {
        return err;
      }
      pointers[i] = &maps[next_map++];
    } else {
      auto base = Operand(args, rets, p);
      if (base.has_error()) return base.error();
      slots[i] = reinterpret_cast<uint64_t>(*base);
    }
  }
  for (size_t i = params.size(); i < params.size() + kSpareSlots; ++i) pointers[i] = &slots[i];
  const int64_t shared = launch[4];
  if (CUresult rc = d.launch_kernel(
          fn, static_cast<unsigned>(launch[0]), static_cast<unsigned>(launch[1]),
          static_cast<unsigned>(launch[2]), static_cast<unsigned>(launch[3]), 1, 1,
          static_cast<unsigned>(shared), stream, pointers, nullptr);
      rc != 0) {
    return CudaError(d, rc, "cuLaunchKernel");
  }
  return ffi::Error::Success();
}

// Initialize stage: loads the call's kernel, outside any stream capture. It binds the execute
// stage's operands and attributes (XLA hands both stages the same call frame).
ffi::Error Load(ffi::RemainingArgs, ffi::RemainingRets, ffi::Span<const uint8_t> cubin,
                std::string_view name, int64_t digest, ffi::Span<const int64_t> launch,
                ffi::Span<const int64_t>, ffi::Span<const int64_t>, ffi::Span<const int64_t>) {
  const Driver& d = GetDriver();
  if (!d.error.empty()) return ffi::Error::Internal("woa_triton_launch: " + d.error);
  if (launch.size() != 5) {
    return ffi::Error::InvalidArgument("woa_triton_launch: malformed launch attributes");
  }
  return LoadFunction(d, cubin, name, digest, launch[4]);
}

// Both stages decode the same operands and attributes: XLA hands each stage the same frame.
template <typename Binding>
auto WithLaunchOperands(Binding binding) {
  return std::move(binding)
      .RemainingArgs()
      .RemainingRets()
      .template Attr<ffi::Span<const uint8_t>>("cubin")
      .template Attr<std::string_view>("name")
      .template Attr<int64_t>("digest")
      .template Attr<ffi::Span<const int64_t>>("launch")
      .template Attr<ffi::Span<const int64_t>>("params")
      .template Attr<ffi::Span<const int64_t>>("scalars")
      .template Attr<ffi::Span<const int64_t>>("tmaps");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(WoaTritonLoad, Load,
                              WithLaunchOperands(ffi::Ffi::BindInitialize()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(WoaTritonLaunch, Launch,
                              WithLaunchOperands(
                                  ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream>>()),
                              {ffi::Traits::kCmdBufferCompatible});
