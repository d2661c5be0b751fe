/* flops.c — the floating-point work of one step as the engine executes it: every matrix product
 * (projections, attention tiles, LM head), recomputation included; elementwise work is left out.
 *
 * Per sequence, with P = the projections' FLOPs per token (2·(C·Q + 2·C·KV + Q·C + 3·C·F)),
 * H = 2·C·V per token and attention on W-wide tiles (each (query tile, key tile) pair at or
 * below the diagonal costs per head 4·wq·wk·HD in the forward and, in the backward, 10 in one
 * pass or 8 in pass 1 and 6 in pass 2 — one pass when the kv heads divide among the threads
 * (sbp_set_threads; src/kernels/fast/attention.c)):
 *   full   = L·(3P + A_fwd + A_bwd) + 3H·T               (forward, then dX and dW)
 *   ckpt   = full + L·(P − 2·F·C + A_fwd)                (the recompute skips the down projection;
 *                                                         Gemma-3's does not: its post-norm needs
 *                                                         the MLP output, + L·2·F·C)
 *   stream = ckpt                                        (K and V are projected once per layer)
 *   DPO adds H·T for its forward-only first pass over the head.
 * A sliding-window layer (Gemma-3's local layers, window Wn) meets for query tile i0 only the key
 * tiles from the one holding key i0 − Wn + 1 (fast/attention.c): its pairs grow as T·Wn, not T²;
 * A_fwd and A_bwd are summed over the layers with each layer's pairs.
 * With a LoRA adapter (o->lora) the base is frozen: no weight-gradient products, so the backward
 * of the projections costs P and of the head H (dX only), and each adapted projection (in K, out
 * N, rank r) adds per token 2r(K + N) forward (again in a recompute, except the down
 * projection's), and 6rK + 4rN backward (x·Aᵀ again, dt and dB, dX and dA). */
#include "../streambp.h"
#include "tiles.h"

double attention_tile_pairs(int s, int e, int W, int win) {
    double pairs = 0;
    for (int i0 = s; i0 < e; i0 = (i0 / W + 1) * W) {
        const int i1 = (i0 / W + 1) * W < e ? (i0 / W + 1) * W : e, wq = i1 - i0;
        const int lo = win ? i0 / W * W - win + 1 : 0;
        for (int j0 = lo > 0 ? lo / W * W : 0; j0 < i1; j0 += W)
            pairs += (double)wq * (j0 + W < i1 ? W : i1 - j0);
    }
    return pairs;
}

static double tile_pairs(int T, int W, int win) {
    return attention_tile_pairs(0, T, W, win);
}

double sbp_step_flops(const sbp_config *c, int B, int T, const sbp_grad_opts *o) {
    const double C = c->hidden, F = c->ffn, V = c->vocab, HD = c->head_dim;
    const double Q = (double)c->heads * HD, KV = (double)c->kv_heads * HD;
    const double P = 2 * (C * Q + 2 * C * KV + Q * C + 3 * C * F), H = 2 * C * V;
    const int W = attention_tile(o->block ? o->block : SBP_DEFAULT_BLOCK);
    /* Σ over the layers of their pairs: the global layers' and the local layers' */
    int local = 0;
    for (int l = 0; l < c->layers; l++) local += sbp_layer_window(c, l) != 0;
    double pairs = (c->layers - local) * tile_pairs(T, W, 0);
    if (local) pairs += local * tile_pairs(T, W, c->sliding_window);
    const double afwd = 4 * pairs * HD * c->heads,
                 abwd = (attention_one_pass(c->kv_heads) ? 10 : 14) * pairs * HD * c->heads;
    const int recompute = o->schedule != SBP_FULL;
    const int gem = c->family == SBP_GEMMA3; /* its recompute runs the down projection too */
    double f;
    if (!o->lora) {
        f = c->layers * 3 * P * T + afwd + abwd + 3 * H * T;
    } else {
        f = c->layers * 2 * P * T + afwd + abwd + 2 * H * T;
        const sbp_lora_config *lc = &o->lora->cfg;
        const double r = lc->r;
        const struct {
            unsigned bit;
            double K, N;
            int in_recompute;
        } proj[] = {{SBP_LORA_Q, C, Q, 1},     {SBP_LORA_K, C, KV, 1},   {SBP_LORA_V, C, KV, 1},
                    {SBP_LORA_O, Q, C, 1},     {SBP_LORA_GATE, C, F, 1}, {SBP_LORA_UP, C, F, 1},
                    {SBP_LORA_DOWN, F, C, gem}};
        for (size_t i = 0; i < sizeof proj / sizeof proj[0]; i++) {
            if (!(lc->targets & proj[i].bit)) continue;
            const double fwd = 2 * r * (proj[i].K + proj[i].N);
            const double bwd = 6 * r * proj[i].K + 4 * r * proj[i].N;
            f += c->layers * T * (fwd + bwd + (recompute && proj[i].in_recompute ? fwd : 0));
        }
    }
    if (recompute) f += c->layers * (P - (gem ? 0 : 2 * F * C)) * T + afwd;
    if (o->objective.kind == SBP_OBJ_DPO) f += H * T;
    return f * B;
}
