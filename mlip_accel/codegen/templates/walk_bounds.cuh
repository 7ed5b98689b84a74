// Launch bounds: runtime.occupancy compiles the walk again with -DMLA_MIN_BLOCKS=<blocks> when ptxas left it a few
// registers above a step of resident blocks per SM (the launch contract is the same either way).
#ifdef MLA_MIN_BLOCKS
#define MLA_WALK_BOUNDS(threads) __launch_bounds__(threads, MLA_MIN_BLOCKS)
#else
#define MLA_WALK_BOUNDS(threads) __launch_bounds__(threads)
#endif
