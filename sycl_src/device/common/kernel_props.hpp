// Kernel properties the attention kernels share, set per device by the host's build options.
#pragma once

#include <sycl/sycl.hpp>

// Intel GPUs with a 256-register mode (PVC, BMG, Lunar Lake): the host defines
// IPEX_FLASH_LARGE_GRF for them (DeviceLimits::large_grf), and each kernel asks for the large
// register file, which removes the spills of the 128-register mode (python -m ipex_flash
// gpu-check shows both). The property reaches the GPU compiler twice: as a decoration of the
// kernel in the SPIR-V, and as the runtime's -ze-opt-large-register-file; the CPU device
// rejects that option, so it never gets the macro.
#if defined(IPEX_FLASH_LARGE_GRF)
#include <sycl/ext/intel/experimental/grf_size_properties.hpp>
#define IPEX_FLASH_REGISTER_FILE \
  SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((sycl::ext::intel::experimental::grf_size<256>))
#else
#define IPEX_FLASH_REGISTER_FILE
#endif

// Device functions taking pointers or arrays that the CPU device's compiler must inline. Past
// its inline threshold it keeps one out of line, and its vectorizer, which must then treat the
// pointer arguments as varying per lane, turns every load through them into gathers: decode
// variants ran 10-20x slower. GPUs inline every call anyway.
#if defined(IPEX_FLASH_CPU_LOOPS)
#define IPEX_FLASH_INLINE __attribute__((always_inline))
#else
#define IPEX_FLASH_INLINE
#endif
