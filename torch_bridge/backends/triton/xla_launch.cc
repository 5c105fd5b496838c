// XLA FFI handler that launches compiled Triton kernels (cubins) on XLA's CUDA stream.
//
// torch_bridge/backends/triton/xla_ffi.py builds this file on first use and registers, as the
// custom call target "woa_triton_launch", two stages: WoaTritonLoad (initialize: load the
// modules) and WoaTritonLaunch (execute: launch them). Each call site carries its kernels as
// attributes (their cubins, entry names, launch shapes, parameter maps), so a compiled
// executable is self-contained. A call launches its kernels in order, each a programmatic
// dependent launch where it was compiled as one (launch_params.h's LaunchStep): one call holds
// a kernel and the dependent that overlaps it, which separate custom calls cannot, since XLA
// records each call into its own node of a command buffer. A module is loaded once per
// (kernel, CUDA context); a call costs a map lookup per kernel, the encoding of its TMA
// descriptors (if any) for this call's buffers, and one cuLaunchKernelEx per kernel. The CUDA
// driver is opened with dlopen, so building needs only a C++17 compiler, XLA's FFI headers and
// cuda.h (Triton ships it).
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

constexpr int64_t kDefaultSharedLimit = 48 * 1024;

// One row of the `kernels` attribute per launch, in order.
enum KernelField { kDigest, kCubinBytes, kGridX, kGridY, kGridZ, kThreads, kShared, kPdl,
                   kParams, kScalars, kTensorMaps, kKernelRow };
constexpr size_t kMaxKernels = 4;

struct Driver {
  decltype(&cuCtxGetCurrent) ctx_get_current = nullptr;
  decltype(&cuModuleLoadData) module_load_data = nullptr;
  decltype(&cuModuleGetFunction) module_get_function = nullptr;
  decltype(&cuFuncSetAttribute) func_set_attribute = nullptr;
  decltype(&cuStreamIsCapturing) stream_is_capturing = nullptr;
  decltype(&cuLaunchKernelEx) launch_ex = nullptr;
  decltype(&cuGetErrorString) get_error_string = nullptr;
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
    woa::Resolve(lib, "cuLaunchKernelEx", d.launch_ex, missing);
    woa::Resolve(lib, "cuGetErrorString", d.get_error_string, missing);
    woa::Resolve(lib, "cuTensorMapEncodeTiled", d.encode_tiled, missing);
    if (missing != nullptr) d.error = std::string("libcuda.so.1 has no ") + missing;
    return d;
  }();
  return driver;
}

ffi::Error CudaError(const Driver& d, int rc, std::string_view what) {
  const char* text = nullptr;
  d.get_error_string(static_cast<CUresult>(rc), &text);
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
  if (CUresult rc = d.ctx_get_current(&ctx); rc != CUDA_SUCCESS) {
    return ffi::Unexpected(CudaError(d, rc, "cuCtxGetCurrent"));
  }
  return ctx;
}

// One kernel of a call: its cubin (a slice of the `cubin` attribute), entry name and launch.
struct Kernel {
  const uint8_t* cubin;
  size_t cubin_bytes;
  std::string_view name;
  int64_t digest;
  woa::Step step;  // step.function is set by GetFunction
};

// Loads the kernel into the current context unless it is there already.
ffi::Error LoadFunction(const Driver& d, const Kernel& k) {
  auto ctx = CurrentContext(d);
  if (ctx.has_error()) return ctx.error();
  const KernelKey key(k.digest, k.cubin_bytes, *ctx);
  std::lock_guard<std::mutex> lock(kernels_mutex);
  if (FindLoaded(key, k.name) != nullptr) return ffi::Error::Success();
  CUmodule module = nullptr;
  if (CUresult rc = d.module_load_data(&module, k.cubin); rc != CUDA_SUCCESS) {
    return CudaError(d, rc, "cuModuleLoadData");
  }
  CUfunction fn = nullptr;
  if (CUresult rc = d.module_get_function(&fn, module, std::string(k.name).c_str());
      rc != CUDA_SUCCESS) {
    return CudaError(d, rc, "cuModuleGetFunction");
  }
  if (k.step.shared > kDefaultSharedLimit) {
    if (CUresult rc = d.func_set_attribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                           static_cast<int>(k.step.shared));
        rc != CUDA_SUCCESS) {
      return CudaError(d, rc, "cuFuncSetAttribute");
    }
  }
  kernels[key].push_back(Loaded{std::string(k.name), fn});
  return ffi::Error::Success();
}

// The kernel's function for a launch on stream. A kernel not loaded yet is loaded here only
// when the stream is not being captured: under capture it means the initialize stage did not
// run, and loading a module there is not stream work, so it is an error.
ffi::Error GetFunction(const Driver& d, CUstream stream, const Kernel& k, CUfunction* fn) {
  auto ctx = CurrentContext(d);
  if (ctx.has_error()) return ctx.error();
  const KernelKey key(k.digest, k.cubin_bytes, *ctx);
  {
    std::lock_guard<std::mutex> lock(kernels_mutex);
    *fn = FindLoaded(key, k.name);
  }
  if (*fn != nullptr) return ffi::Error::Success();
  CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_NONE;
  if (CUresult rc = d.stream_is_capturing(stream, &capturing); rc != CUDA_SUCCESS) {
    return CudaError(d, rc, "cuStreamIsCapturing");
  }
  if (capturing != CU_STREAM_CAPTURE_STATUS_NONE) {
    return ffi::Error::Internal(
        "woa_triton_launch: kernel " + std::string(k.name) + " is not loaded and the stream is "
        "being captured into a command buffer: the initialize stage (WoaTritonLoad) did not "
        "run for this call; a module is never loaded under capture");
  }
  if (ffi::Error err = LoadFunction(d, k); err.failure()) return err;
  std::lock_guard<std::mutex> lock(kernels_mutex);
  *fn = FindLoaded(key, k.name);
  return ffi::Error::Success();
}

// The call's kernels, read from its attributes:
//   cubin:   the kernels' cubins, concatenated;
//   names:   their entry names, separated by single spaces;
//   kernels: one KernelField row per kernel;
//   params, scalars, tmaps: the kernels' parameter maps (launch_params.h), concatenated.
ffi::Error ReadKernels(ffi::Span<const uint8_t> cubin, std::string_view names,
                       ffi::Span<const int64_t> rows, ffi::Span<const int64_t> params,
                       ffi::Span<const int64_t> scalars, ffi::Span<const int64_t> tmaps,
                       Kernel (&out)[kMaxKernels], size_t* count) {
  const auto malformed = [](const char* what) {
    return ffi::Error::InvalidArgument(std::string("woa_triton_launch: malformed attributes: ") +
                                       what);
  };
  if (rows.size() == 0 || rows.size() % kKernelRow != 0 ||
      rows.size() / kKernelRow > kMaxKernels) {
    return malformed("kernels");
  }
  *count = rows.size() / kKernelRow;
  size_t at_cubin = 0, at_name = 0, at_param = 0, at_scalar = 0, at_map = 0;
  for (size_t i = 0; i < *count; ++i) {
    const int64_t* row = rows.begin() + i * kKernelRow;
    if (row[kCubinBytes] < 0 || row[kParams] < 0 || row[kScalars] < 0 || row[kTensorMaps] < 0) {
      return malformed("kernels");
    }
    const size_t bytes = static_cast<size_t>(row[kCubinBytes]);
    const size_t n_params = static_cast<size_t>(row[kParams]);
    const size_t n_scalars = static_cast<size_t>(row[kScalars]);
    const size_t n_tmaps = static_cast<size_t>(row[kTensorMaps]) * woa::kTensorMapRow;
    if (at_cubin + bytes > cubin.size()) return malformed("cubin");
    if (at_param + n_params > params.size() || at_scalar + n_scalars > scalars.size() ||
        at_map + n_tmaps > tmaps.size()) {
      return malformed("parameter map");
    }
    const size_t end = names.find(' ', at_name);
    if (at_name >= names.size()) return malformed("names");
    Kernel& k = out[i];
    k.cubin = cubin.begin() + at_cubin;
    k.cubin_bytes = bytes;
    k.name = names.substr(at_name, end == std::string_view::npos ? end : end - at_name);
    k.digest = row[kDigest];
    k.step = woa::Step{nullptr,
                       {static_cast<unsigned>(row[kGridX]), static_cast<unsigned>(row[kGridY]),
                        static_cast<unsigned>(row[kGridZ])},
                       static_cast<unsigned>(row[kThreads]),
                       static_cast<unsigned>(row[kShared]),
                       row[kPdl] != 0,
                       params.begin() + at_param,
                       n_params,
                       scalars.begin() + at_scalar,
                       n_scalars,
                       tmaps.begin() + at_map,
                       n_tmaps};
    at_cubin += bytes;
    at_name = end == std::string_view::npos ? names.size() : end + 1;
    at_param += n_params;
    at_scalar += n_scalars;
    at_map += n_tmaps;
  }
  return ffi::Error::Success();
}

ffi::ErrorOr<void*> Operand(ffi::RemainingArgs& args, ffi::RemainingRets& rets, int64_t i) {
  if (i < 0) return ffi::Unexpected(ffi::Error::InvalidArgument("woa_triton_launch: operand"));
  if (static_cast<size_t>(i) < args.size()) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return ffi::Unexpected(buffer.error());
    return buffer->untyped_data();
  }
  auto buffer = rets.get<ffi::AnyBuffer>(i - args.size());
  if (buffer.has_error()) return ffi::Unexpected(buffer.error());
  return (*buffer)->untyped_data();
}

// Operands count inputs, then outputs.
ffi::Error Launch(CUstream stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                  ffi::Span<const uint8_t> cubin, std::string_view names,
                  ffi::Span<const int64_t> rows, ffi::Span<const int64_t> params,
                  ffi::Span<const int64_t> scalars, ffi::Span<const int64_t> tmaps) {
  const Driver& d = GetDriver();
  if (!d.error.empty()) return ffi::Error::Internal("woa_triton_launch: " + d.error);
  Kernel calls[kMaxKernels];
  size_t count = 0;
  if (ffi::Error err = ReadKernels(cubin, names, rows, params, scalars, tmaps, calls, &count);
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
  for (size_t i = 0; i < count; ++i) {
    Kernel& k = calls[i];
    if (ffi::Error err = GetFunction(d, stream, k, &k.step.function); err.failure()) return err;
    const woa::LaunchResult done =
        woa::LaunchStep(d.launch_ex, d.encode_tiled, k.step, stream, operand);
    if (done.packing == woa::PackError::kOperand) return operand_error;
    if (done.packing == woa::PackError::kEncode) {
      return CudaError(d, done.cuda, "cuTensorMapEncodeTiled");
    }
    if (done.packing != woa::PackError::kNone) {
      return ffi::Error::InvalidArgument(std::string("woa_triton_launch: ") +
                                         woa::PackErrorText(done.packing));
    }
    if (done.cuda != CUDA_SUCCESS) return CudaError(d, done.cuda, "cuLaunchKernelEx");
  }
  return ffi::Error::Success();
}

// Initialize stage: loads the call's kernels, outside any stream capture. It binds the execute
// stage's operands and attributes (XLA hands both stages the same call frame).
ffi::Error Load(ffi::RemainingArgs, ffi::RemainingRets, ffi::Span<const uint8_t> cubin,
                std::string_view names, ffi::Span<const int64_t> rows,
                ffi::Span<const int64_t> params, ffi::Span<const int64_t> scalars,
                ffi::Span<const int64_t> tmaps) {
  const Driver& d = GetDriver();
  if (!d.error.empty()) return ffi::Error::Internal("woa_triton_launch: " + d.error);
  Kernel calls[kMaxKernels];
  size_t count = 0;
  if (ffi::Error err = ReadKernels(cubin, names, rows, params, scalars, tmaps, calls, &count);
      err.failure()) {
    return err;
  }
  for (size_t i = 0; i < count; ++i) {
    if (ffi::Error err = LoadFunction(d, calls[i]); err.failure()) return err;
  }
  return ffi::Error::Success();
}

// Both stages decode the same operands and attributes: XLA hands each stage the same frame.
template <typename Binding>
auto WithLaunchOperands(Binding binding) {
  return std::move(binding)
      .RemainingArgs()
      .RemainingRets()
      .template Attr<ffi::Span<const uint8_t>>("cubin")
      .template Attr<std::string_view>("names")
      .template Attr<ffi::Span<const int64_t>>("kernels")
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
