// A CPU stand-in for the little of CUDA the generated kernels use, so tests can run the generated source
// on machines without a GPU (CI). Every thread of a block is a std::thread; blocks run one after the
// other; warp shuffles exchange through a per-warp slot array between two barriers, so a kernel whose
// lanes diverge around a shuffle deadlocks here exactly where it would be undefined on a GPU.
// Only C headers: the shim is compiled with every generated module, so it must parse fast.
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <math.h>  // expf / exp (the activation kernels)

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};

namespace emu {
struct Warp {
  pthread_barrier_t bar;
  uint64_t slots[32];
};
inline pthread_mutex_t atomic_mutex = PTHREAD_MUTEX_INITIALIZER;
inline thread_local Warp* tl_warp = nullptr;
inline thread_local pthread_barrier_t* tl_block_bar = nullptr;
}  // namespace emu

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
// one block runs at a time: a function-static array is the running block's shared memory
#define __shared__ static
inline void __syncthreads() { pthread_barrier_wait(emu::tl_block_bar); }

// CUDA's vector types the generated kernels load and store whole (16 or 8 bytes per access)
struct float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
inline float2 make_float2(float x, float y) { return float2{x, y}; }

template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcs(const T* p) { return *p; }
template <class T> inline void __stcs(T* p, T v) { *p = v; }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, sizeof f); return f; }
inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, sizeof d); return d; }
inline long long __double_as_longlong(double d) { long long i; memcpy(&i, &d, sizeof i); return i; }
inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) {
  pthread_mutex_lock(&emu::atomic_mutex);
  unsigned long long old = *p;
  if (v > old) *p = v;
  pthread_mutex_unlock(&emu::atomic_mutex);
  return old;
}

template <class T> inline T atomicAdd(T* p, T v) {
  pthread_mutex_lock(&emu::atomic_mutex);
  T old = *p;
  *p = old + v;
  pthread_mutex_unlock(&emu::atomic_mutex);
  return old;
}

template <class T> inline T emu_exchange(T v, int src) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  emu::Warp& w = *emu::tl_warp;
  const int lane = threadIdx.x & 31;
  memcpy(&w.slots[lane], &v, sizeof(T));
  pthread_barrier_wait(&w.bar);
  T r;
  memcpy(&r, &w.slots[src & 31], sizeof(T));
  pthread_barrier_wait(&w.bar);
  return r;
}
template <class T> inline T __shfl_sync(unsigned, T v, int src) { return emu_exchange(v, src); }
template <class T> inline T __shfl_xor_sync(unsigned, T v, int mask) {
  return emu_exchange(v, (int)(threadIdx.x & 31) ^ mask);
}
template <class T> inline T __shfl_up_sync(unsigned, T v, unsigned delta) {  // lanes below delta keep their own
  const int lane = (int)(threadIdx.x & 31);
  return emu_exchange(v, lane >= (int)delta ? lane - (int)delta : lane);
}

// Every lane of the warp must call it (a full warp: blocks of a multiple of 32 threads).
inline unsigned __ballot_sync(unsigned, bool predicate) {
  emu::Warp& w = *emu::tl_warp;
  const int lane = threadIdx.x & 31;
  w.slots[lane] = predicate ? 1u : 0u;
  pthread_barrier_wait(&w.bar);
  unsigned mask = 0;
  for (int l = 0; l < 32; ++l) mask |= (unsigned)(w.slots[l] & 1u) << l;
  pthread_barrier_wait(&w.bar);
  return mask;
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(unsigned v) { return __builtin_ffs((int)v); }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline double __dmul_rn(double a, double b) { return a * b; }

namespace emu {
typedef void (*Body)(const unsigned long long* args);

struct ThreadStart {
  Body body;
  const unsigned long long* args;
  dim3 grid, block, block_index, thread_index;
  Warp* warp;
  pthread_barrier_t* block_bar;
};

inline void* thread_main(void* p) {
  const ThreadStart& s = *(const ThreadStart*)p;
  threadIdx = s.thread_index;
  blockIdx = s.block_index;
  blockDim = s.block;
  gridDim = s.grid;
  tl_warp = s.warp;
  tl_block_bar = s.block_bar;
  s.body(s.args);
  return nullptr;
}

// Blocks one after the other; the threads of a block concurrently (warps need their lanes together).
inline void run_grid(dim3 grid, dim3 block, Body body, const unsigned long long* args) {
  const int threads = (int)(block.x * block.y * block.z);
  const int nwarps = (threads + 31) / 32;
  Warp* warps = new Warp[nwarps];
  ThreadStart* starts = new ThreadStart[threads];
  pthread_t* pool = new pthread_t[threads];
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        for (int w = 0; w < nwarps; ++w)
          pthread_barrier_init(&warps[w].bar, nullptr, (unsigned)(threads - 32 * w < 32 ? threads - 32 * w : 32));
        pthread_barrier_t block_bar;
        pthread_barrier_init(&block_bar, nullptr, (unsigned)threads);
        for (int t = 0; t < threads; ++t) {
          starts[t] = ThreadStart{body, args, grid, block, dim3{bx, by, bz},
                                  dim3{(unsigned)(t % block.x), (unsigned)(t / block.x % block.y),
                                       (unsigned)(t / (block.x * block.y))},
                                  &warps[t / 32], &block_bar};
          pthread_create(&pool[t], nullptr, thread_main, &starts[t]);
        }
        for (int t = 0; t < threads; ++t) pthread_join(pool[t], nullptr);
        for (int w = 0; w < nwarps; ++w) pthread_barrier_destroy(&warps[w].bar);
        pthread_barrier_destroy(&block_bar);
      }
  delete[] pool;
  delete[] starts;
  delete[] warps;
}
}  // namespace emu
