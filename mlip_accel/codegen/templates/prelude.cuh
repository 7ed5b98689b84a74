// Shared by every kernel mlip_accel generates. NVRTC compiles it without any system header.
typedef ${scalar} T;
#define FULL_MASK 0xffffffffu

// Node rows and edge attributes are read by many warps: keep them in the caches.
static __device__ __forceinline__ T ld_keep(const T* p) { return __ldg(p); }
// Per-edge weights are read exactly once: stream them (evict-first) so node rows stay in L2.
static __device__ __forceinline__ T ld_stream(const T* p) { return __ldcs(p); }
static __device__ __forceinline__ void st_stream(T* p, T v) { __stcs(p, v); }
