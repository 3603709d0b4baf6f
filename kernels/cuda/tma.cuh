#ifndef RINGATTN_KERNELS_CUDA_TMA_CUH_
#define RINGATTN_KERNELS_CUDA_TMA_CUH_

// Hopper's tensor memory accelerator (TMA) as our kernels use it (sm_90):
// tiled copies of a tensor box from global to shared memory, counted by
// mbarriers in shared memory that threads wait on by phase parity, and what
// warp-specialized kernels need besides: named barriers between warpgroups
// and per-warpgroup register reallocation.

#include <cuda.h>

#include <cstdint>

namespace ringattn {
namespace device {

__device__ __forceinline__ uint32_t SharedAddress32(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// Sets up the barrier at `barrier` to complete a phase after `arrivals`
// arrivals (and the bytes announced by ExpectBytes).
__device__ __forceinline__ void InitBarrier(uint64_t* barrier,
                                            uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(
                   SharedAddress32(barrier)),
               "r"(arrivals)
               : "memory");
}

// Makes barrier initialization visible to the async proxy (TMA).
__device__ __forceinline__ void FenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Arrives at `barrier` and announces `bytes` that copies will deliver to it
// in the current phase.
__device__ __forceinline__ void ArriveExpectingBytes(uint64_t* barrier,
                                                     uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   SharedAddress32(barrier)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void Arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(
                   SharedAddress32(barrier))
               : "memory");
}

// Waits until the phase of `barrier` with parity `parity` has completed.
__device__ __forceinline__ void WaitBarrier(uint64_t* barrier,
                                            uint32_t parity) {
  const uint32_t address = SharedAddress32(barrier);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(address), "r"(parity)
        : "memory");
  } while (done == 0);
}

// Copies the box of `map` at coordinates (c0, c1, c2, c3) (innermost first)
// to `shared`, completing `bytes` of `barrier`'s transaction count.
__device__ __forceinline__ void CopyBox4d(void* shared, const CUtensorMap& map,
                                          int c0, int c1, int c2, int c3,
                                          uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_"
      "tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(
          SharedAddress32(shared)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(SharedAddress32(barrier))
      : "memory");
}

// Waits at named barrier `id` (1-15; 0 is __syncthreads) until `threads`
// threads have arrived or waited there.
__device__ __forceinline__ void SyncNamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Counts this thread at named barrier `id` without waiting.
__device__ __forceinline__ void ArriveNamedBarrier(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Lowers or raises this warpgroup's registers per thread to kRegisters; every
// thread of the warpgroup must call it.
template <int kRegisters>
__device__ __forceinline__ void LowerRegisters() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void RaiseRegisters() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

}  // namespace device
}  // namespace ringattn

#endif  // RINGATTN_KERNELS_CUDA_TMA_CUH_
