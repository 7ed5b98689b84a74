// The MD integrators' half-steps as a few fused kernels (mlip_accel.codegen.md_update): ASE's VelocityVerlet
// (NVE) and Langevin with FixCom (NVT), the equations of integrations/device_md.py's torch path, in float64.
// Positions, momenta, forces: [atoms, 3] row-major; per-atom columns ([atoms] or [atoms, 1]): masses and the
// integrators' coefficients; consts: [dt / 2, dt, (1 - c2) / dt]. One thread per atom, ${block} per block.
// Sums over atoms (the centre of mass, kinetic energy, the finiteness sum) go through per-block partials in a
// fixed order (a shared-memory tree, then the partials in block order): bitwise the same on every run. The
// largest displacement is an atomicMax on the bits of a non-negative double (order-free, so deterministic; a
// NaN's bits are above every finite value's, so a NaN displacement is kept and fails the check).
typedef double T;
#define BLOCK ${block}

// the sum of v over the block's threads, in a fixed tree order (every thread of the block must call it)
static __device__ __forceinline__ T block_sum(T v, T* s) {
  s[threadIdx.x] = v;
  __syncthreads();
  for (int half = BLOCK / 2; half > 0; half /= 2) {
    if ((int)threadIdx.x < half) s[threadIdx.x] += s[threadIdx.x + half];
    __syncthreads();
  }
  const T total = s[0];
  __syncthreads();
  return total;
}

// the sum of the 3-vectors partials[0..blocks) in block order, into shared sum3 (every thread must call it)
static __device__ __forceinline__ void sum_partials3(const T* partials, long long blocks, T* sum3) {
  if (threadIdx.x < 3) {
    T acc = 0;
    for (long long b = 0; b < blocks; ++b) acc += partials[3 * b + threadIdx.x];
    sum3[threadIdx.x] = acc;
  }
  __syncthreads();
}

// the block's kinetic energy and sum(F) into partials[block] (every thread of the block must call it)
static __device__ __forceinline__ void record_partials(T kinetic, T forces, T* s, T* partials) {
  kinetic = block_sum(kinetic, s);
  forces = block_sum(forces, s);
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = kinetic;
    partials[2 * blockIdx.x + 1] = forces;
  }
}

static __device__ __forceinline__ void track_displacement(const T* x, const T* x_built, long long i, T* moved2) {
  T d2 = 0;
  for (int c = 0; c < 3; ++c) {
    const T d = x[3 * i + c] - x_built[3 * i + c];
    d2 += d * d;
  }
  atomicMax((unsigned long long*)moved2, (unsigned long long)__double_as_longlong(d2));
}

// NVE, before the model: p += dt/2 F; x += dt p / m; the largest displacement since the list was built
extern "C" __global__ void __launch_bounds__(BLOCK) mla_md_nve_pre(
    ${nve_pre})
{
  const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
  if (i >= atoms) return;
  for (int c = 0; c < 3; ++c) {
    const T pc = p[3 * i + c] + consts[0] * f[3 * i + c];
    p[3 * i + c] = pc;
    x[3 * i + c] += pc * dt_over_m[i];
  }
  track_displacement(x, x_built, i, moved2);
}

// NVE, after the model: p += dt/2 F; per-block partials of the kinetic energy and of sum(F)
extern "C" __global__ void __launch_bounds__(BLOCK) mla_md_nve_post(
    ${nve_post})
{
  __shared__ T s[BLOCK];
  const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
  T kinetic = 0, forces = 0;
  if (i < atoms) {
    for (int c = 0; c < 3; ++c) {
      const T pc = p[3 * i + c] + consts[0] * f[3 * i + c];
      p[3 * i + c] = pc;
      kinetic += pc * pc * half_over_m[i];
      forces += f[3 * i + c];
    }
  }
  record_partials(kinetic, forces, s, partials);
}

// NVT, before the model, up to the move: this step's noise, Langevin's random terms and velocity, the move
// dt v + rnd_pos; per-block partials of the mass-weighted move (the centre of mass's)
extern "C" __global__ void __launch_bounds__(BLOCK) mla_md_nvt_pre(
    ${nvt_pre})
{
  __shared__ T s[BLOCK];
  const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
  const T* xi = noise + noise_index[0] * 6 * atoms;  // noise[k, 0]: xi, noise[k, 1]: eta
  const T* eta = xi + 3 * atoms;
  T com[3] = {0, 0, 0};
  if (i < atoms) {
    for (int c = 0; c < 3; ++c) {
      const long long j = 3 * i + c;
      const T rp = c5[i] * eta[j];
      const T rv = c3[i] * xi[j] - c4[i] * eta[j];
      const T v = (rv + c1_over_m[i] * f[j]) + keep_over_m[i] * p[j];
      const T mv = rp + consts[1] * v;
      rnd_pos[j] = rp;
      rnd_vel[j] = rv;
      move[j] = mv;
      com[c] = mass_share[i] * mv;
    }
  }
  for (int c = 0; c < 3; ++c) {
    const T total = block_sum(com[c], s);
    if (threadIdx.x == 0) partials[3 * blockIdx.x + c] = total;
  }
}

// NVT, before the model: the move without its centre-of-mass part (FixCom), the new positions, the largest
// displacement; the next step's noise
extern "C" __global__ void __launch_bounds__(BLOCK) mla_md_nvt_move(
    ${nvt_move})
{
  __shared__ T com[3];
  sum_partials3(partials, blocks, com);
  const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
  if (i >= atoms) return;
  for (int c = 0; c < 3; ++c) {
    const T mv = move[3 * i + c] - com[c];
    move[3 * i + c] = mv;
    x[3 * i + c] += mv;
  }
  track_displacement(x, x_built, i, moved2);
  if (i == 0) noise_index[0] += 1;  // read by mla_md_nvt_pre only, which has finished
}

// NVT, after the model: the velocity of the constrained move and the second kick, as momenta; per-block
// partials of the total momentum
extern "C" __global__ void __launch_bounds__(BLOCK) mla_md_nvt_post(
    ${nvt_post})
{
  __shared__ T s[BLOCK];
  const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
  T total[3] = {0, 0, 0};
  if (i < atoms) {
    for (int c = 0; c < 3; ++c) {
      const long long j = 3 * i + c;
      const T v = (rnd_vel[j] + c1_over_m[i] * f[j]) + consts[2] * (move[j] - rnd_pos[j]);
      const T pc = v * m[i];
      p[j] = pc;
      total[c] = pc;
    }
  }
  for (int c = 0; c < 3; ++c) {
    const T sum = block_sum(total[c], s);
    if (threadIdx.x == 0) partials[3 * blockIdx.x + c] = sum;
  }
}

// NVT, after the model: no centre-of-mass momentum (FixCom); per-block partials of the kinetic energy and sum(F)
extern "C" __global__ void __launch_bounds__(BLOCK) mla_md_nvt_momentum(
    ${nvt_momentum})
{
  __shared__ T s[BLOCK];
  __shared__ T momentum[3];
  sum_partials3(momentum_partials, blocks, momentum);
  const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
  T kinetic = 0, forces = 0;
  if (i < atoms) {
    for (int c = 0; c < 3; ++c) {
      const T pc = p[3 * i + c] - mass_share[i] * momentum[c];
      p[3 * i + c] = pc;
      kinetic += pc * pc * half_over_m[i];
      forces += f[3 * i + c];
    }
  }
  record_partials(kinetic, forces, s, partials);
}

// The step's record, one block: records[index + 1] = (energy, kinetic energy, sum(F) + energy); index += 1
extern "C" __global__ void __launch_bounds__(BLOCK) mla_md_record(
    ${record})
{
  __shared__ T s[BLOCK];
  T kinetic = 0, forces = 0;
  for (long long b = threadIdx.x; b < blocks; b += BLOCK) {
    kinetic += partials[2 * b];
    forces += partials[2 * b + 1];
  }
  kinetic = block_sum(kinetic, s);
  forces = block_sum(forces, s);
  if (threadIdx.x == 0) {
    const long long row = index[0] + 1;
    index[0] = row;
    records[3 * row] = energy[0];
    records[3 * row + 1] = kinetic;
    records[3 * row + 2] = forces + energy[0];
  }
}
