// Launches a sequence of compiled Triton kernels on one CUDA stream in one call, for torch's
// eager calls that repeat a launch signature (native.py builds this file on first use and calls
// it through ctypes).
//
// Each step names a kernel Triton has already loaded (its CUfunction), its launch shape and its
// parameter map (launch_params.h). Operands 0-3 are the call's own addresses; the others are
// fixed when the steps are bound. A call packs each step's parameters (encoding its TMA
// descriptors for this call's addresses) and launches it (woa::LaunchStep), as a programmatic
// dependent launch where the kernel was compiled as one. No Python object is
// touched here, and nothing is kept across calls.

#include <cstdint>

#include "cuda.h"
#include "launch_params.h"

namespace {

constexpr int64_t kOpen = 4;
// Our own failures, beside CUresult codes (which are >= 0).
constexpr int kNoDriver = -1;
constexpr int kPackBase = -100;  // kPackBase - PackError

struct Driver {
  decltype(&cuLaunchKernelEx) launch_ex = nullptr;
  decltype(&cuFuncGetParamInfo) param_info = nullptr;
  decltype(&cuGetErrorString) error_string = nullptr;
  woa::EncodeTiled encode_tiled = nullptr;
  const char* missing = nullptr;
};

const Driver& GetDriver() {
  static const Driver driver = [] {
    Driver d;
    void* lib = woa::OpenDriver();
    if (lib == nullptr) {
      d.missing = "libcuda.so.1";
      return d;
    }
    woa::Resolve(lib, "cuLaunchKernelEx", d.launch_ex, d.missing);
    woa::Resolve(lib, "cuGetErrorString", d.error_string, d.missing);
    woa::Resolve(lib, "cuTensorMapEncodeTiled", d.encode_tiled, d.missing);
    woa::Resolve(lib, "cuFuncGetParamInfo", d.param_info, d.missing);
    return d;
  }();
  return driver;
}

}  // namespace

extern "C" {

// The driver function this library lacks (nullptr: none).
const char* woa_native_missing() { return GetDriver().missing; }

// The text of a woa_native_launch result.
const char* woa_native_error(int code) {
  if (code == kNoDriver) return "the CUDA driver lacks a function this launcher needs";
  if (code <= kPackBase) return woa::PackErrorText(static_cast<woa::PackError>(kPackBase - code));
  const char* text = nullptr;
  const Driver& d = GetDriver();
  if (d.error_string == nullptr || d.error_string(static_cast<CUresult>(code), &text) != 0) {
    return "unknown CUDA error";
  }
  return text;
}

// The byte size of each of `function`'s first `count` parameters into `sizes`; the number of
// parameters it has when that is fewer (a CUDA error as a negative number).
int64_t woa_native_param_sizes(uint64_t function, int64_t* sizes, int64_t count) {
  const Driver& d = GetDriver();
  if (d.missing != nullptr) return kNoDriver;
  for (int64_t i = 0; i < count; ++i) {
    size_t offset = 0, size = 0;
    CUresult rc = d.param_info(reinterpret_cast<CUfunction>(function), static_cast<size_t>(i),
                               &offset, &size);
    if (rc == CUDA_ERROR_INVALID_VALUE) return i;
    if (rc != CUDA_SUCCESS) return -static_cast<int64_t>(rc);
    sizes[i] = static_cast<int64_t>(size);
  }
  return count;
}

// Launches `steps` in order on `stream`. Operand i is open[i] for i < 4, else fixed[i - 4].
// Returns 0, a CUresult, or one of our negative codes (woa_native_error).
int woa_native_launch(const woa::Step* steps, int64_t n_steps, const uint64_t* fixed,
                      uint64_t stream, uint64_t open0, uint64_t open1, uint64_t open2,
                      uint64_t open3) {
  const Driver& d = GetDriver();
  if (d.missing != nullptr) return kNoDriver;
  const uint64_t open[kOpen] = {open0, open1, open2, open3};
  auto operand = [&](int64_t i, void** address) {
    if (i < 0) return false;
    *address = reinterpret_cast<void*>(i < kOpen ? open[i] : fixed[i - kOpen]);
    return true;
  };
  for (int64_t s = 0; s < n_steps; ++s) {
    const woa::LaunchResult done = woa::LaunchStep(
        d.launch_ex, d.encode_tiled, steps[s], reinterpret_cast<CUstream>(stream), operand);
    if (done.packing == woa::PackError::kEncode) return done.cuda;
    if (done.packing != woa::PackError::kNone) return kPackBase - static_cast<int>(done.packing);
    if (done.cuda != CUDA_SUCCESS) return done.cuda;
  }
  return 0;
}

}  // extern "C"
