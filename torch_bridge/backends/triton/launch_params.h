// What xla_launch.cc (XLA's custom call) and native_launch.cc (torch's eager launches) share:
// opening the CUDA driver, and launching a compiled Triton kernel (LaunchStep) with its
// parameters packed from the parameter map that xla_ffi.params writes:
//   params: one entry per kernel parameter: an operand index when >= 0, -1 for the next value of
//           `scalars`, -2 for the next TMA descriptor of `tmaps` (passed by value; the shape and
//           strides parameters that follow it are scalars), -3 for a pointer into an operand
//           (the next two scalars: the operand index and a byte offset);
//   tmaps:  rows of kTensorMapRow values: operand, CUtensorMapDataType, element bytes, swizzle
//           (CUtensorMapSwizzle), NaN padding (0/1), rank (<= 2), box[2], shape[2], row stride in
//           elements (outermost first, as Triton's host descriptors list them).
// Every parameter gets an 8-byte slot; the driver copies as many bytes as the parameter has
// (little-endian: a 4-byte integer is the slot's low half).

#ifndef WOA_LAUNCH_PARAMS_H_
#define WOA_LAUNCH_PARAMS_H_

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>

#include "cuda.h"

namespace woa {

// The CUDA driver library, opened once by each library that includes this (nullptr: absent).
inline void* OpenDriver() {
  static void* const lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  return lib;
}

// `fn` = the driver's `name`; the first name the driver lacks goes to `missing`.
template <typename F>
void Resolve(void* lib, const char* name, F& fn, const char*& missing) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr && missing == nullptr) missing = name;
}

// Parameters beyond the kernel's own are ignored by cuLaunchKernel; Triton appends up to two
// scratch pointers (unused by the kernels launched here), which get these null slots.
constexpr size_t kSpareSlots = 4;
constexpr size_t kMaxParams = 64;
constexpr size_t kMaxTensorMaps = 4;
constexpr size_t kTensorMapRow = 12;
constexpr int kL2Promotion128B = 2;  // CU_TENSOR_MAP_L2_PROMOTION_L2_128B, as Triton encodes

struct alignas(64) TensorMap {
  uint64_t opaque[16];  // CUtensorMap
};

// cuTensorMapEncodeTiled, with CUresult as int and CUtensorMap as TensorMap.
using EncodeTiled = int (*)(TensorMap*, int, unsigned, void*, const uint64_t*, const uint64_t*,
                            const unsigned*, const unsigned*, int, int, int, int);

enum class PackError { kNone, kTooManyParams, kTooFewScalars, kTooFewTensorMaps, kBadRank,
                       kOperand, kEncode };

inline const char* PackErrorText(PackError e) {
  switch (e) {
    case PackError::kNone: return "no error";
    case PackError::kTooManyParams: return "too many kernel parameters";
    case PackError::kTooFewScalars: return "too few scalars";
    case PackError::kTooFewTensorMaps: return "too few tensor maps";
    case PackError::kBadRank: return "TMA rank";
    case PackError::kOperand: return "operand";
    case PackError::kEncode: return "cuTensorMapEncodeTiled";
  }
  return "unknown";
}

struct Packed {
  uint64_t slots[kMaxParams + kSpareSlots] = {};
  void* pointers[kMaxParams + kSpareSlots];
  TensorMap maps[kMaxTensorMaps];
  int cuda_error = 0;  // the CUresult of a failed encode
};

// Encodes a tiled TMA descriptor as Triton's launcher does (dims innermost first, byte strides).
inline PackError EncodeTensorMap(EncodeTiled encode, const int64_t* row, void* base,
                                 TensorMap* map, int* cuda_error) {
  const unsigned rank = static_cast<unsigned>(row[5]);
  if (rank < 1 || rank > 2) return PackError::kBadRank;
  uint64_t dims[2], strides[1] = {0};
  unsigned box[2], element_strides[2] = {1, 1};
  for (unsigned i = 0; i < rank; ++i) {
    dims[rank - 1 - i] = static_cast<uint64_t>(row[8 + i]);
    box[rank - 1 - i] = static_cast<unsigned>(row[6 + i]);
  }
  if (rank == 2) strides[0] = static_cast<uint64_t>(row[10] * row[2]);
  *cuda_error = encode(map, static_cast<int>(row[1]), rank, base, dims, strides, box,
                       element_strides, 0, static_cast<int>(row[3]), kL2Promotion128B,
                       static_cast<int>(row[4]));
  return *cuda_error == 0 ? PackError::kNone : PackError::kEncode;
}

// Fills `out` for one launch. `operand(i, &address)` resolves operand i to a device address and
// returns false when it cannot.
template <typename Operand>
PackError PackParams(const int64_t* params, size_t n_params, const int64_t* scalars,
                     size_t n_scalars, const int64_t* tmaps, size_t n_tmaps, EncodeTiled encode,
                     Operand operand, Packed* out) {
  if (n_params > kMaxParams) return PackError::kTooManyParams;
  size_t next_scalar = 0, next_map = 0;
  for (size_t i = 0; i < n_params; ++i) {
    const int64_t p = params[i];
    out->pointers[i] = &out->slots[i];
    if (p == -1) {
      if (next_scalar == n_scalars) return PackError::kTooFewScalars;
      out->slots[i] = static_cast<uint64_t>(scalars[next_scalar++]);
    } else if (p == -2) {
      if (next_map == kMaxTensorMaps || (next_map + 1) * kTensorMapRow > n_tmaps) {
        return PackError::kTooFewTensorMaps;
      }
      const int64_t* row = tmaps + next_map * kTensorMapRow;
      void* base = nullptr;
      if (!operand(row[0], &base)) return PackError::kOperand;
      PackError e = EncodeTensorMap(encode, row, base, &out->maps[next_map], &out->cuda_error);
      if (e != PackError::kNone) return e;
      out->pointers[i] = &out->maps[next_map++];
    } else if (p == -3) {
      if (next_scalar + 2 > n_scalars) return PackError::kTooFewScalars;
      void* base = nullptr;
      if (!operand(scalars[next_scalar], &base)) return PackError::kOperand;
      out->slots[i] = reinterpret_cast<uint64_t>(base) +
                      static_cast<uint64_t>(scalars[next_scalar + 1]);
      next_scalar += 2;
    } else {
      void* base = nullptr;
      if (!operand(p, &base)) return PackError::kOperand;
      out->slots[i] = reinterpret_cast<uint64_t>(base);
    }
  }
  for (size_t i = n_params; i < n_params + kSpareSlots; ++i) out->pointers[i] = &out->slots[i];
  return PackError::kNone;
}

// One kernel launch: the loaded function, its launch shape and parameter map.
struct Step {
  CUfunction function;
  unsigned grid[3];
  unsigned threads;
  unsigned shared;
  bool pdl;  // a programmatic dependent launch: the kernel waits (griddepcontrol) for its writer
  const int64_t* params;
  size_t n_params;
  const int64_t* scalars;
  size_t n_scalars;
  const int64_t* tmaps;
  size_t n_tmaps;
};

// How a LaunchStep failed: a packing error (kEncode with the CUresult in `cuda`), or kNone and
// the launch's CUresult (0: launched).
struct LaunchResult {
  PackError packing = PackError::kNone;
  int cuda = 0;
  bool ok() const { return packing == PackError::kNone && cuda == 0; }
};

// Packs `step`'s parameters (`operand` as for PackParams) and launches it on `stream` with
// cuLaunchKernelEx: under stream capture a programmatic launch records a programmatic edge
// from the kernel before it, so the pair keeps its overlap in a CUDA graph.
template <typename Operand>
LaunchResult LaunchStep(decltype(&cuLaunchKernelEx) launch_ex, EncodeTiled encode,
                        const Step& step, CUstream stream, Operand operand) {
  Packed packed;
  const PackError packing =
      PackParams(step.params, step.n_params, step.scalars, step.n_scalars, step.tmaps,
                 step.n_tmaps, encode, operand, &packed);
  if (packing != PackError::kNone) return LaunchResult{packing, packed.cuda_error};
  CUlaunchAttribute attribute = {};
  attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attribute.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig config = {};
  config.gridDimX = step.grid[0];
  config.gridDimY = step.grid[1];
  config.gridDimZ = step.grid[2];
  config.blockDimX = step.threads;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = step.shared;
  config.hStream = stream;
  config.attrs = step.pdl ? &attribute : nullptr;
  config.numAttrs = step.pdl ? 1 : 0;
  return LaunchResult{PackError::kNone,
                      static_cast<int>(launch_ex(&config, step.function, packed.pointers,
                                                 nullptr))};
}

}  // namespace woa

#endif  // WOA_LAUNCH_PARAMS_H_
