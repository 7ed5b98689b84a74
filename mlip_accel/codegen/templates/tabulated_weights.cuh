// The weights come from a radial table by edge length (ops.radial_table), never from a W in memory: `coeffs`
// [intervals, W_NUMEL, 4] holds each weight's Horner coefficients in t on each interval (the table repacked
// so that one weight's four are one 16-byte access); `ce` is the edge's interval row, located once per edge.
${table_interval}
struct Cubic { T c0, c1, c2, c3; };

static __device__ __forceinline__ Cubic tab_cubic(const T* row, int j) {
${load}
}

static __device__ __forceinline__ Cubic no_cubic() {
  Cubic q; q.c0 = T(0); q.c1 = T(0); q.c2 = T(0); q.c3 = T(0);
  return q;
}

// the weight at t, and its derivative by t (times intervals / r_max: by r)
static __device__ __forceinline__ T cubic_at(const Cubic& q, T t) { return q.c0 + t * (q.c1 + t * (q.c2 + t * q.c3)); }
static __device__ __forceinline__ T cubic_slope(const Cubic& q, T t) {
  return q.c1 + t * (T(2) * q.c2 + T(3) * t * q.c3);
}
