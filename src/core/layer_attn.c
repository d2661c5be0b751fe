/* layer_attn.c — what attention a layer of a config runs: its window and its softmax scale.
 * Facts of the config (src/io/config.c reads it), used by the engine, the FLOP count and the
 * planner alike. */
#include "../streambp.h"

#include <math.h>

int sbp_layer_window(const sbp_config *c, int layer) {
    if (c->family != SBP_GEMMA3 || c->sliding_window_pattern < 1) return 0;
    /* Gemma3Attention.is_sliding = bool((layer_idx + 1) % config.sliding_window_pattern) */
    return (layer + 1) % c->sliding_window_pattern != 0 ? c->sliding_window : 0;
}

double sbp_attn_scale(const sbp_config *c) {
    const double d = c->family == SBP_GEMMA3 ? c->query_pre_attn_scalar : (double)c->head_dim;
    return 1.0 / sqrt(d);
}
