// Where length r falls among `intervals` equal intervals of [0, rm] (reference/radial_table.py, _locate): the
// interval (returned) and t in [0, 1] in it. NaN and negative lengths read interval 0 at t = 0, lengths beyond
// rm the last knot (t = 1). Shared by the table's kernels and the convolution walks that read a table.
static __device__ __forceinline__ long long table_interval(T r, T rm, long long intervals, T& t) {
  const T rc = r != r ? T(0) : (r < T(0) ? T(0) : (r > rm ? rm : r));
  const T x = rc * (T(intervals) / rm);
  long long i = (long long)x;
  if (i > intervals - 1) i = intervals - 1;
  t = x - T(i);
  return i;
}
