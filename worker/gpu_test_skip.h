#ifndef RINGATTN_WORKER_GPU_TEST_SKIP_H_
#define RINGATTN_WORKER_GPU_TEST_SKIP_H_

// SKIP_WITHOUT_GPUS: the first statement of a GPU test. Skips the test, saying
// why, unless this machine has `needed` CUDA devices; otherwise keeps NCCL off
// NVLink multicast (DisableNcclMulticast) before the test starts NCCL.

#include "gtest/gtest.h"
#include "worker/device.h"
#include "worker/nccl_communicator.h"

#define SKIP_WITHOUT_GPUS(needed)                                           \
  do {                                                                      \
    const int count = ::ringattn::CudaDeviceCount();                        \
    if (count < (needed)) {                                                 \
      GTEST_SKIP() << "needs " << (needed) << " CUDA device(s); this "      \
                   << "machine has " << count << "; runs on a GPU machine"; \
    }                                                                       \
    ::ringattn::DisableNcclMulticast();                                     \
  } while (0)

#endif  // RINGATTN_WORKER_GPU_TEST_SKIP_H_
