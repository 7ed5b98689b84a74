// Prefetch hints (codegen/prefetch.py): one 128-byte line of the next edge's rows moved toward the SM while this
// edge computes. A hint never faults and changes no value.
#ifdef __CUDA_ARCH__
static __device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" :: "l"(p)); }
static __device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" :: "l"(p)); }
#else  // the CPU emulator (tests): read the byte, so that an address outside every allocation fails there
static __device__ __forceinline__ void prefetch_l1(const void* p) { (void)*(const volatile char*)p; }
static __device__ __forceinline__ void prefetch_l2(const void* p) { (void)*(const volatile char*)p; }
#endif
