  case ${labels}: {  // phase ${phase}: ${segments}
${acc_decl}
    long long row = -1;
    bool first = true;
    for (long long qb = q0; qb < q1; qb += 32) {
      // Each lane fetches the ids of one upcoming edge; the loop broadcasts them, so the dependent loads
      // order -> edge -> node row overlap across 32 edges instead of stalling every edge.
      const long long qn = qb + lane;
      long long my_e = 0, my_key = 0, my_other = 0;
      if (qn < q1) {
        my_e = ${order_expr};
        my_key = ${key_expr};
        my_other = ${other_expr};
      }
      const int nb = (int)(q1 - qb < 32 ? q1 - qb : 32);
      for (int b = 0; b < nb; ++b) {
        const long long e = __shfl_sync(FULL_MASK, my_e, b);
        const long long key = __shfl_sync(FULL_MASK, my_key, b);
        const long long other = __shfl_sync(FULL_MASK, my_other, b);${prefetch}
${row_change}
${body}
      }
    }
${final_flush}
  } break;
