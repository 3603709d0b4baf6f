#ifndef RINGATTN_CORE_RANDOM_TENSOR_H_
#define RINGATTN_CORE_RANDOM_TENSOR_H_

// Fresh random inputs for tests, benchmarks and the demo: values uniform in
// [-1, 1), reproducible from the generator's state.

#include <cstdint>
#include <random>

#include "core/tensor.h"

namespace ringattn {

inline Tensor<float> RandomTensor(Shape shape, std::mt19937& rng) {
  Tensor<float> t(shape);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& x : t.values()) x = uniform(rng);
  return t;
}

inline Tensor<float> RandomTensor(Shape shape, uint32_t seed) {
  std::mt19937 rng(seed);
  return RandomTensor(shape, rng);
}

}  // namespace ringattn

#endif  // RINGATTN_CORE_RANDOM_TENSOR_H_
