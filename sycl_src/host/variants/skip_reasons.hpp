// Why a variant policy passed over a faster form of a kernel (the matrix engine, its register
// forms, the decode kernel's matrix scores), as xformers' not_supported_reasons: one short
// sentence each. Collected only where a caller asks (C.plan's "reasons", python -m ipex_flash
// plan): the launches pass no collector and build no string. The fallbacks decided at run
// time (a program the device's compiler cannot build, an engine that fails the tile-layout
// check) warn with the same sentences.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ipex_flash {

using SkipReasons = std::vector<std::string>;

// The run-time fallbacks' reasons (build_guard.hpp, matrix_layout_probe.hpp).
inline constexpr char kBuildRefused[] =
    "the device's compiler cannot build the matrix program (build guard)";
inline constexpr char kLayoutRefused[] =
    "the matrix engine failed the tile-layout check the register forms rely on";

// Moves `reasons` to the end of `why` (nothing when why is null).
inline void add_reasons(SkipReasons* why, SkipReasons& reasons) {
  if (why == nullptr) return;
  for (std::string& reason : reasons) why->push_back(std::move(reason));
}

}  // namespace ipex_flash
