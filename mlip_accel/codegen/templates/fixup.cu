// Second pass of the deterministic walk: rows split between warps. Slot s holds the partial sum of the
// first row of warp s (positions [s * edges_per_warp, ...)). Slots of one row are consecutive; the head
// slot of each run adds the run's partials, in slot order, to the row (which already holds the owner
// warp's store, or zero). One block per slot, threads over columns: bitwise reproducible.
extern "C" __global__ void ${kernel}(
    ${parameters})
{
  const long long s = blockIdx.x;
  const long long row = keys[order[s * edges_per_warp]];
  if (s > 0 && keys[order[(s - 1) * edges_per_warp]] == row) return;  // not the head of its run
  long long end = s + 1;
  while (end < num_slots && keys[order[end * edges_per_warp]] == row) ++end;
  for (int c = threadIdx.x; c < width; c += blockDim.x) {
    T acc = fixup[s * width + c];
    for (long long t = s + 1; t < end; ++t) acc += fixup[t * width + c];
    out[row * width + c] += acc;
  }
}
