// A full neighbour list by brute force over the atoms and the periodic images each receiver can reach, generated
// by mlip_accel.codegen.neighbor_list (runtime/neighbor_list.py prepares the lattice on the host, once per cell).
//
// lattice (doubles): [0, 9) the cell vectors as rows, open axes completed by orthonormal vectors; [9, 18) its
// inverse (fractional = position @ inverse); [18, 21) reach per axis: cutoff over the axis' plane spacing, plus a
// margin, on periodic axes, -1 on open ones; [21] cutoff^2.
//
//   wrap:  one thread per atom: fractions = positions @ inverse, wraps = floor(fractions) on periodic axes,
//          points = positions - wraps @ cell, fractions -= wraps (in [0, 1) up to rounding)
//   count: one warp per receiver i (blocks of ${block_threads} threads, a multiple of 32): counts[i] = its edges
//   fill:  one warp per receiver i: its edges at [ends[i] - counts[i], ends[i]) (ends: the inclusive sum of the
//          counts) in chunk order of 32 senders, then image order, then lane order: the same order on every run
// Edge (i, j, S): |points[j] + S @ cell - points[i]|^2 < cutoff^2, except j == i in the zero image; its unit shift
// for the unwrapped positions (ASE's ijS: positions[j] - positions[i] + shift @ cell) is S - wraps[j] + wraps[i].
// The images of receiver i: per periodic axis a, S_a in [ceil(f_a - 1 - reach_a), floor(f_a + reach_a)] (f the
// receiver's fractions): beyond, no point of the shifted cell is within the cutoff along that axis' planes.
#define FULL_MASK 0xffffffffu

extern "C" __global__ void __launch_bounds__(${block_threads}) ${wrap}(
    ${wrap_parameters})
{
  const long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= atoms) return;
  double f[3], w[3];
  for (int a = 0; a < 3; ++a) {
    f[a] = positions[3 * n] * lattice[9 + a] + positions[3 * n + 1] * lattice[12 + a]
           + positions[3 * n + 2] * lattice[15 + a];
    w[a] = lattice[18 + a] >= 0.0 ? floor(f[a]) : 0.0;
    fractions[3 * n + a] = f[a] - w[a];
    wraps[3 * n + a] = (long long)w[a];
  }
  for (int a = 0; a < 3; ++a)
    points[3 * n + a] = positions[3 * n + a] - (w[0] * lattice[a] + w[1] * lattice[3 + a] + w[2] * lattice[6 + a]);
}

// The images receiver i reaches: lo[a]..hi[a] per axis (0..0 on open axes).
static __device__ __forceinline__ void image_range(const double* lattice, const double* fractions, long long i,
                                                   long long* lo, long long* hi) {
  for (int a = 0; a < 3; ++a) {
    const double reach = lattice[18 + a], f = fractions[3 * i + a];
    lo[a] = reach >= 0.0 ? (long long)ceil(f - 1.0 - reach) : 0;
    hi[a] = reach >= 0.0 ? (long long)floor(f + reach) : 0;
  }
}

// The hit mask of this warp's chunk of senders in image (sa, sb, sc); lane's sender at d relative to the receiver.
static __device__ __forceinline__ unsigned hits(const double* lattice, long long sa, long long sb, long long sc,
                                                bool real, bool self, const double* d) {
  double r2 = 0.0;
  for (int a = 0; a < 3; ++a) {
    const double x = d[a] + sa * lattice[a] + sb * lattice[3 + a] + sc * lattice[6 + a];
    r2 += x * x;
  }
  const bool hit = real && !(self && sa == 0 && sb == 0 && sc == 0) && r2 < lattice[21];
  return __ballot_sync(FULL_MASK, hit);
}

// The chunk's senders relative to receiver i: d, and whether lane's sender exists.
static __device__ __forceinline__ bool sender(const double* points, long long atoms, long long i, long long j,
                                              double* d) {
  const bool real = j < atoms;
  for (int a = 0; a < 3; ++a) d[a] = real ? points[3 * j + a] - points[3 * i + a] : 0.0;
  return real;
}

extern "C" __global__ void __launch_bounds__(${block_threads}) ${count}(
    ${count_parameters})
{
  const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (i >= atoms) return;  // the whole warp
  long long lo[3], hi[3];
  image_range(lattice, fractions, i, lo, hi);
  long long n = 0;
  for (long long base = 0; base < atoms; base += 32) {
    double d[3];
    const bool real = sender(points, atoms, i, base + lane, d);
    for (long long sa = lo[0]; sa <= hi[0]; ++sa)
      for (long long sb = lo[1]; sb <= hi[1]; ++sb)
        for (long long sc = lo[2]; sc <= hi[2]; ++sc)
          n += __popc(hits(lattice, sa, sb, sc, real, base + lane == i, d));
  }
  if (lane == 0) counts[i] = n;
}

extern "C" __global__ void __launch_bounds__(${block_threads}) ${fill}(
    ${fill_parameters})
{
  const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (i >= atoms) return;  // the whole warp
  long long lo[3], hi[3];
  image_range(lattice, fractions, i, lo, hi);
  const unsigned below = (1u << lane) - 1u;  // the lanes before this one
  long long e = i == 0 ? 0 : ends[i - 1];
  for (long long base = 0; base < atoms; base += 32) {
    const long long j = base + lane;
    double d[3];
    const bool real = sender(points, atoms, i, j, d);
    for (long long sa = lo[0]; sa <= hi[0]; ++sa)
      for (long long sb = lo[1]; sb <= hi[1]; ++sb)
        for (long long sc = lo[2]; sc <= hi[2]; ++sc) {
          const unsigned mask = hits(lattice, sa, sb, sc, real, j == i, d);
          if ((mask >> lane) & 1u) {
            const long long at = e + __popc(mask & below);
            const long long s[3] = {sa, sb, sc};
            receivers[at] = i;
            senders[at] = j;
            for (int a = 0; a < 3; ++a) unit_shifts[3 * at + a] = s[a] - wraps[3 * j + a] + wraps[3 * i + a];
          }
          e += __popc(mask);
        }
  }
}
