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

#include "launch_params.h"
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

struct Driver {
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*module_load_data)(CUmodule*, const void*) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*func_set_attribute)(CUfunction, int, int) = nullptr;
  CUresult (*stream_is_capturing)(CUstream, int*) = nullptr;
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, unsigned, CUstream, void**, void**) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
  woa::EncodeTiled encode_tiled = nullptr;
  std::string error;
};

const Driver& GetDriver() {
  static const Driver driver = [] {
    Driver d;
    void* lib = woa::OpenDriver();
    if (lib == nullptr) {
      d.error = std::string("cannot open libcuda.so.1: ") + dlerror();
      return d;
    }
    const char* missing = nullptr;
    woa::Resolve(lib, "cuCtxGetCurrent", d.ctx_get_current, missing);
    woa::Resolve(lib, "cuModuleLoadData", d.module_load_data, missing);
    woa::Resolve(lib, "cuModuleGetFunction", d.module_get_function, missing);
    woa::Resolve(lib, "cuFuncSetAttribute", d.func_set_attribute, missing);
    woa::Resolve(lib, "cuStreamIsCapturing", d.stream_is_capturing, missing);
    woa::Resolve(lib, "cuLaunchKernel", d.launch_kernel, missing);
    woa::Resolve(lib, "cuGetErrorString", d.get_error_string, missing);
    woa::Resolve(lib, "cuTensorMapEncodeTiled", d.encode_tiled, missing);
    if (missing != nullptr) d.error = std::string("libcuda.so.1 has no ") + missing;
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

// launch: {grid_x, grid_y, grid_z, threads per block, dynamic shared bytes}.
// params, scalars, tmaps: the parameter map (launch_params.h); operands count inputs, then
// outputs.
ffi::Error Launch(CUstream stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                  ffi::Span<const uint8_t> cubin, std::string_view name, int64_t digest,
                  ffi::Span<const int64_t> launch, ffi::Span<const int64_t> params,
                  ffi::Span<const int64_t> scalars, ffi::Span<const int64_t> tmaps) {
  const Driver& d = GetDriver();
  if (!d.error.empty()) return ffi::Error::Internal("woa_triton_launch: " + d.error);
  if (launch.size() != 5) {
    return ffi::Error::InvalidArgument("woa_triton_launch: malformed launch attributes");
  }
  CUfunction fn = nullptr;
  if (ffi::Error err = GetFunction(d, stream, cubin, name, digest, launch[4], &fn);
      err.failure()) {
    return err;
  }
  ffi::Error operand_error = ffi::Error::Success();
  auto operand = [&](int64_t i, void** address) {
    auto base = Operand(args, rets, i);
    if (base.has_error()) {
      operand_error = base.error();
      return false;
    }
    *address = *base;
    return true;
  };
  woa::Packed packed;
  const woa::PackError packing = woa::PackParams(
      params.begin(), params.size(), scalars.begin(), scalars.size(), tmaps.begin(),
      tmaps.size(), d.encode_tiled, operand, &packed);
  if (packing == woa::PackError::kOperand) return operand_error;
  if (packing == woa::PackError::kEncode) {
    return CudaError(d, packed.cuda_error, "cuTensorMapEncodeTiled");
  }
  if (packing != woa::PackError::kNone) {
    return ffi::Error::InvalidArgument(std::string("woa_triton_launch: ") +
                                       woa::PackErrorText(packing));
  }
  const int64_t shared = launch[4];
  if (CUresult rc = d.launch_kernel(
          fn, static_cast<unsigned>(launch[0]), static_cast<unsigned>(launch[1]),
          static_cast<unsigned>(launch[2]), static_cast<unsigned>(launch[3]), 1, 1,
          static_cast<unsigned>(shared), stream, packed.pointers, nullptr);
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
