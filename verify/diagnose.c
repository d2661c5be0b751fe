/* diagnose.c — the rules of diagnose.h.
 *
 * Thresholds, and why:
 *   pure scale     |k − 1| above the row's threshold and ‖theirs − k·truth‖/‖truth‖ within it:
 *                  the tensor would pass once divided by k. Without a relative-L2 threshold
 *                  (diff --bitwise, --ulp), the residual must be below 1% of |k − 1|.
 *   mostly scale   the residual after the best factor is at most 0.3 × the error: one factor
 *                  removes at least 91% of the squared error, but not all of it.
 *   same factor    factors within 4 × the larger residual (at least 1e-9 relative) of each other.
 *   fraction       continued fractions with denominators up to 64, accepted within
 *                  4 × the residual (at least 1e-12, at most 1e-4, relative): fractions with
 *                  q <= 64 are ~2.4e-4 apart, so a factor that is not one rarely matches.
 *   precision      with a measured budget at the next lower precision: every failing tensor
 *                  within it. Without one: float32-level means a relative L2 in [1e-10, 1e-4]
 *                  for a float64 claim (float32 rounding gives 1e-8..1e-5 on real models);
 *                  bf16-level means [3e-4, 5e-2] for a float32 claim (bf16's unit roundoff is
 *                  3.9e-3).
 *   loss           their loss off by the factor, or equal to the truth, within 1e-5 relative. */
#include "diagnose.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FRACTION_MAX_DEN 64
#define MOSTLY_SCALE     0.3
#define MAX_GROUPS       520 /* layers + embedding, final norm, head */

void sbp_diag_add(sbp_diagnosis *d, const char *rule, const char *fmt, ...) {
    if (d->n >= SBP_DIAG_MAX) return;
    snprintf(d->rule[d->n], sizeof d->rule[0], "%s", rule);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->text[d->n], sizeof d->text[0], fmt, ap);
    va_end(ap);
    d->n++;
}

/* ---------------------------------------------------------------------------------------------
 * Names */

static const char *kind_names[SBP_P_NKINDS] = {
    [SBP_P_EMBED] = "embed_tokens",
    [SBP_P_Q] = "q_proj",
    [SBP_P_QB] = "q_proj.bias",
    [SBP_P_K] = "k_proj",
    [SBP_P_KB] = "k_proj.bias",
    [SBP_P_V] = "v_proj",
    [SBP_P_VB] = "v_proj.bias",
    [SBP_P_O] = "o_proj",
    [SBP_P_QNORM] = "q_norm",
    [SBP_P_KNORM] = "k_norm",
    [SBP_P_GATE] = "gate_proj",
    [SBP_P_UP] = "up_proj",
    [SBP_P_DOWN] = "down_proj",
    [SBP_P_IN_NORM] = "input_layernorm",
    [SBP_P_POST_NORM] = "post_attention_layernorm",
    [SBP_P_FINAL_NORM] = "model.norm",
    [SBP_P_LM_HEAD] = "lm_head",
    [SBP_P_PRE_FF_NORM] = "pre_feedforward_layernorm",
    [SBP_P_POST_FF_NORM] = "post_feedforward_layernorm",
};

/* the part of a layer parameter's name after "model.layers.N." */
static const struct {
    const char *suffix;
    sbp_param_kind kind;
} layer_suffixes[] = {
    {"self_attn.q_proj.weight", SBP_P_Q},
    {"self_attn.q_proj.bias", SBP_P_QB},
    {"self_attn.k_proj.weight", SBP_P_K},
    {"self_attn.k_proj.bias", SBP_P_KB},
    {"self_attn.v_proj.weight", SBP_P_V},
    {"self_attn.v_proj.bias", SBP_P_VB},
    {"self_attn.o_proj.weight", SBP_P_O},
    {"self_attn.q_norm.weight", SBP_P_QNORM},
    {"self_attn.k_norm.weight", SBP_P_KNORM},
    {"mlp.gate_proj.weight", SBP_P_GATE},
    {"mlp.up_proj.weight", SBP_P_UP},
    {"mlp.down_proj.weight", SBP_P_DOWN},
    {"input_layernorm.weight", SBP_P_IN_NORM},
    {"post_attention_layernorm.weight", SBP_P_POST_NORM},
    {"pre_feedforward_layernorm.weight", SBP_P_PRE_FF_NORM},
    {"post_feedforward_layernorm.weight", SBP_P_POST_FF_NORM},
};

void sbp_diag_classify(const char *name, int *kind, int *layer) {
    *kind = *layer = -1;
    if (strcmp(name, "model.embed_tokens.weight") == 0) *kind = SBP_P_EMBED;
    if (strcmp(name, "model.norm.weight") == 0) *kind = SBP_P_FINAL_NORM;
    if (strcmp(name, "lm_head.weight") == 0) *kind = SBP_P_LM_HEAD;
    int l, len = 0;
    if (*kind >= 0 || sscanf(name, "model.layers.%d.%n", &l, &len) != 1 || len == 0 || l < 0)
        return;
    for (size_t i = 0; i < sizeof layer_suffixes / sizeof layer_suffixes[0]; i++)
        if (strcmp(name + len, layer_suffixes[i].suffix) == 0)
            *kind = layer_suffixes[i].kind, *layer = l;
}

int sbp_diag_fraction(double x, int max_den, double tol, long *p, long *q) {
    if (!isfinite(x) || x == 0) return 0;
    double ax = fabs(x), r = ax;
    long h0 = 1, h1 = 0, k0 = 0, k1 = 1; /* convergents h/k of the continued fraction */
    for (int it = 0; it < 40; it++) {
        double a = floor(r);
        if (a > 1e9) break;
        long h = (long)a * h0 + h1, k = (long)a * k0 + k1;
        if (k > max_den) break;
        h1 = h0, k1 = k0, h0 = h, k0 = k;
        if (fabs(ax - (double)h / k) <= tol * ax) {
            *p = x < 0 ? -h : h, *q = k;
            return 1;
        }
        if (r - a < 1e-15) break;
        r = 1 / (r - a);
    }
    return 0;
}

/* "19/21 = 0.9047619", "2", "-1", "1.000000001": enough digits to show how far from 1 */
static void factor_text(char *buf, size_t n, double k, double tol) {
    long p, q;
    int digits = 7;
    if (k != 1 && isfinite(k)) {
        int d = (int)ceil(-log10(fabs(k - 1))) + 2;
        digits = d > 17 ? 17 : d > digits ? d : digits;
    }
    if (sbp_diag_fraction(k, FRACTION_MAX_DEN, tol, &p, &q)) {
        if (q == 1)
            snprintf(buf, n, "%ld", p);
        else
            snprintf(buf, n, "%ld/%ld = %.*g", p, q, digits, (double)p / (double)q);
    } else {
        snprintf(buf, n, "%.*g", digits, k);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Rules */

typedef struct {
    const sbp_diag_row *rows;
    int n;
    const sbp_diag_input *in;
    int L;        /* layers seen in the names */
    int *is_pure; /* (n) the failing row is a pure scale error */
} ctx;

static int finite_fail(const sbp_diag_row *r) {
    return r->judged && r->failed && r->cmp.nonfinite_a == 0 && isfinite(r->cmp.rel_l2);
}

static double pass_threshold(const sbp_diag_row *r) {
    return r->budget > 0 ? r->budget : 0.01 * fabs(r->cmp.scale - 1);
}

static int pure_scale(const sbp_diag_row *r) {
    double k = r->cmp.scale, res = r->cmp.rel_l2_rescaled, t = pass_threshold(r);
    return finite_fail(r) && isfinite(k) && isfinite(res) && fabs(k - 1) > t && res <= t;
}

/* names: an extra tensor that is a missing one behind a wrapper prefix; a tied model's head */
static void rule_names(sbp_diagnosis *d, const ctx *x) {
    static const char *wrappers[] = {"module.", "_orig_mod.", "base_model.model."};
    int hits[3] = {0}, missing = 0;
    for (int i = 0; i < x->n; i++) missing += x->rows[i].missing;
    for (int e = 0; e < x->in->n_extra; e++) {
        const char *name = x->in->extra[e];
        for (int w = 0; w < 3; w++) {
            /* strip every occurrence of the wrapper (DDP inside compile, and so on) */
            char buf[256];
            size_t o = 0;
            for (const char *s = name; *s && o + 1 < sizeof buf;)
                if (strncmp(s, wrappers[w], strlen(wrappers[w])) == 0 &&
                    (s == name || s[-1] == '.'))
                    s += strlen(wrappers[w]);
                else
                    buf[o++] = *s++;
            buf[o] = 0;
            if (strcmp(buf, name) == 0) continue;
            for (int i = 0; i < x->n; i++)
                if (x->rows[i].missing && strcmp(x->rows[i].name, buf) == 0) hits[w]++;
        }
    }
    static const char *why[] = {"DDP/FSDP's wrapper", "torch.compile's wrapper", "peft's wrapper"};
    for (int w = 0; w < 3; w++)
        if (hits[w])
            sbp_diag_add(d, "names",
                         "%d of the %d missing tensors are in the file under the prefix \"%s\" "
                         "(%s): write HF names (streambp.dump_grads strips wrappers)",
                         hits[w], missing, wrappers[w], why[w]);
    for (int e = 0; e < x->in->n_extra; e++)
        if (x->in->tied == 1 && strcmp(x->in->extra[e], "lm_head.weight") == 0)
            sbp_diag_add(d, "names",
                         "lm_head.weight is in the file, but this model ties the head to "
                         "model.embed_tokens.weight: write one tensor under the embedding's "
                         "name holding both gradients' sum");
}

/* nonfinite: the first tensor with NaN/Inf in backward order (the reverse of the model's) */
static void rule_nonfinite(sbp_diagnosis *d, const ctx *x) {
    int count = 0, first = -1;
    for (int i = x->n - 1; i >= 0; i--)
        if (x->rows[i].judged && x->rows[i].cmp.nonfinite_a) count++, first = first < 0 ? i : first;
    if (count)
        sbp_diag_add(d, "nonfinite",
                     "NaN/Inf in %d tensor%s; the first in backward order (head first, embedding "
                     "last) is %s: the non-finite value most likely starts there",
                     count, count > 1 ? "s" : "", x->rows[first].name);
}

/* "; their loss is off by the same factor" and the like: how their loss compares with the
 * truth's, next to a gradient factor k (0: none) */
static void loss_note(char *buf, size_t n, const sbp_diag_input *in, double k) {
    buf[0] = 0;
    const char *ref = in->reference ? in->reference : "the truth";
    if (!in->their_loss || in->truth_loss == 0) return;
    char *end;
    double tl = strtod(in->their_loss, &end), r = tl / in->truth_loss;
    if (end == in->their_loss || !isfinite(r)) return;
    if (k != 0 && fabs(r - k) <= 1e-5 * fabs(r))
        snprintf(buf, n, "; their loss is off by the same factor");
    else if (fabs(r - 1) <= 1e-5)
        snprintf(buf, n,
                 "; their loss equals %s's, so the forward pass is right and the backward is not",
                 ref);
    else
        snprintf(buf, n, "; their loss is %.4g times %s's", r, ref);
}

typedef struct {
    double k, res; /* factor, largest residual */
    int count;
    int first; /* a row with it */
} factor_group;

/* scale: returns 1 when factors explain every finite failure (pure, or mostly a factor) */
static int rule_scale(sbp_diagnosis *d, ctx *x) {
    factor_group g[8];
    int ng = 0, failing = 0, pure = 0, mostly = 0, judged = 0;
    const char *ref = x->in->reference ? x->in->reference : "the truth";
    double kmin = INFINITY, kmax = -INFINITY, res_mostly = 0;
    for (int i = 0; i < x->n; i++) {
        const sbp_diag_row *r = &x->rows[i];
        judged += r->judged;
        if (!finite_fail(r)) continue;
        failing++;
        if ((x->is_pure[i] = pure_scale(r))) {
            pure++;
            double k = r->cmp.scale, res = r->cmp.rel_l2_rescaled;
            int j = 0;
            for (; j < ng; j++)
                if (fabs(k - g[j].k) <= fmax(1e-9 * fabs(g[j].k), 4 * fmax(res, g[j].res))) break;
            if (j == ng && ng < 8) g[ng++] = (factor_group){.k = k, .first = i};
            if (j < ng) g[j].count++, g[j].res = fmax(g[j].res, res);
        } else if (r->cmp.rel_l2_rescaled <= MOSTLY_SCALE * r->cmp.rel_l2) {
            mostly++;
            kmin = fmin(kmin, r->cmp.scale), kmax = fmax(kmax, r->cmp.scale);
            res_mostly = fmax(res_mostly, r->cmp.rel_l2_rescaled / r->cmp.rel_l2);
        }
    }
    if (!failing) return 0;
    if (pure == failing && ng == 1) {
        char f[64], loss[200];
        double tol = fmin(1e-4, fmax(1e-12, 4 * g[0].res));
        factor_text(f, sizeof f, g[0].k, tol);
        loss_note(loss, sizeof loss, x->in, g[0].k);
        const char *hint =
            g[0].k < 0 ? "the sign is flipped (a loss negated, or an update written as the "
                         "gradient?)"
                       : "a wrong normaliser (a count of tokens, rows or pairs, or a factor "
                         "such as beta applied twice or not at all)";
        if (failing == 1)
            sbp_diag_add(d, "scale", "%s is %s times %s (after that factor %.2g is left): %s%s",
                         x->rows[g[0].first].name, ref, f, g[0].res, hint, loss);
        else
            sbp_diag_add(d, "scale",
                         "all %d failing tensors are %s times one factor, %s (after it at most "
                         "%.2g is left): %s%s%s",
                         failing, ref, f, g[0].res, hint,
                         failing == judged ? "; one factor in every tensor points at the loss's "
                                             "normaliser"
                                           : "",
                         loss);
        return 1;
    }
    if (pure) {
        char list[400] = "";
        for (int j = 0; j < ng && j < 3; j++) {
            char f[64];
            factor_text(f, sizeof f, g[j].k, fmin(1e-4, fmax(1e-12, 4 * g[j].res)));
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s (%d tensor%s, e.g. %s)",
                     j ? ", " : "", f, g[j].count, g[j].count > 1 ? "s" : "",
                     x->rows[g[j].first].name);
        }
        sbp_diag_add(d, "scale",
                     "%d of %d failing tensors are %s times a factor, but not one "
                     "factor: %s%s: normalisers that differ by part (per chunk, per row, per "
                     "micro-batch?)",
                     pure, failing, ref, list, ng > 3 ? ", ..." : "");
    }
    if (mostly)
        sbp_diag_add(d, "scale",
                     "%d failing tensor%s %s mostly a scale error: after the best factor (%.5g "
                     "to %.5g) at most %.2g%% of the error is left, but not none: parts of the "
                     "gradient weighted by different factors (a per-chunk, per-row or per-pair "
                     "normaliser or weight?)",
                     mostly, mostly > 1 ? "s" : "", mostly > 1 ? "are" : "is", kmin, kmax,
                     100 * res_mostly);
    return pure + mostly == failing;
}

static const char *prec_name(sbp_diag_prec p) {
    return p == SBP_DIAG_FP64 ? "float64" : p == SBP_DIAG_FP32 ? "float32" : "bfloat16";
}

/* precision: the failures that are not a factor sit at the level of a lower precision */
static int rule_precision(sbp_diagnosis *d, const ctx *x) {
    sbp_diag_prec c = x->in->claimed;
    if (c != SBP_DIAG_FP64 && c != SBP_DIAG_FP32) return 0;
    int n = 0, ok = 0, fits = 0, measured = 1;
    double lo = INFINITY, hi = 0, blo = INFINITY, bhi = 0;
    for (int i = 0; i < x->n; i++) {
        const sbp_diag_row *r = &x->rows[i];
        if (!finite_fail(r) || x->is_pure[i]) continue;
        n++;
        double e = r->cmp.rel_l2;
        int level;
        if (r->lower_budget > 0) {
            level = e <= r->lower_budget;
            blo = fmin(blo, r->lower_budget), bhi = fmax(bhi, r->lower_budget);
        } else {
            measured = 0;
            level = c == SBP_DIAG_FP64 ? e >= 1e-10 && e <= 1e-4 : e >= 3e-4 && e <= 5e-2;
        }
        ok += level;
        lo = fmin(lo, e), hi = fmax(hi, e);
        fits += c == SBP_DIAG_FP64 ? r->cmp.a_is_f32 : r->cmp.a_is_bf16;
    }
    int judged = 0, failed = 0;
    for (int i = 0; i < x->n; i++) judged += x->rows[i].judged, failed += finite_fail(&x->rows[i]);
    /* a lower precision's rounding reaches most tensors; a few failing ones point elsewhere */
    if (!n || ok < n || 2 * failed < judged) return 0;
    const char *lower = c == SBP_DIAG_FP64 ? "float32" : "bfloat16";
    char level[160];
    if (measured)
        snprintf(level, sizeof level,
                 "relative L2 %.2g to %.2g, within our %s budget of %.2g to %.2g", lo, hi,
                 prec_name(x->in->lower), blo, bhi);
    else
        snprintf(level, sizeof level, "relative L2 %.2g to %.2g, the level of %s rounding", lo, hi,
                 lower);
    if (c == SBP_DIAG_FP64)
        sbp_diag_add(d, "precision",
                     "%d failing tensor%s %s float32-level error (%s): your fp64 gradients have "
                     "float32-level error: float32 islands such as RoPE angles (HF computes "
                     "inv_freq, cos and sin in float32 even for float64 models), RMSNorm "
                     "upcasts or the loss upcast",
                     n, n > 1 ? "s" : "", n > 1 ? "have" : "has", level);
    else
        sbp_diag_add(d, "precision",
                     "%d failing tensor%s %s bfloat16-level error (%s): your fp32 gradients went "
                     "through bfloat16 somewhere: autocast, bf16 weights or activations, or a "
                     "bf16 gradient buffer",
                     n, n > 1 ? "s" : "", n > 1 ? "have" : "has", level);
    if (fits == n)
        sbp_diag_add(d, "precision",
                     "every value of the failing tensor%s is exactly a %s number: computed or "
                     "stored in %s, then widened",
                     n > 1 ? "s" : "", lower, lower);
    return 1;
}

static int group_of(const sbp_diag_row *r, int L) {
    if (r->layer >= 0) return r->layer < L ? r->layer : -1;
    if (r->kind == SBP_P_EMBED) return L;
    if (r->kind == SBP_P_FINAL_NORM) return L + 1;
    if (r->kind == SBP_P_LM_HEAD) return L + 2;
    return -1;
}

/* "layers 1, 3", "layer 1", "layers 0-2" (runs collapsed) */
static void layer_list(char *buf, size_t n, const int *fail, int L) {
    int count = 0;
    for (int l = 0; l < L; l++) count += fail[l] > 0;
    size_t o = (size_t)snprintf(buf, n, "%s ", count > 1 ? "layers" : "layer");
    int first = 1;
    for (int l = 0; l < L && o < n; l++) {
        if (!fail[l]) continue;
        int e = l;
        while (e + 1 < L && fail[e + 1]) e++;
        o += (size_t)snprintf(buf + o, n - o, "%s%d", first ? "" : ", ", l);
        if (e > l + 1 && o < n) o += (size_t)snprintf(buf + o, n - o, "-%d", e);
        if (e == l + 1 && o < n) o += (size_t)snprintf(buf + o, n - o, ", %d", e);
        first = 0, l = e;
    }
}

/* layers, top: where in the network the failures are */
static void rule_layers(sbp_diagnosis *d, const ctx *x, int explained) {
    const int L = x->L;
    if (L + 3 > MAX_GROUPS) return;
    int judged[MAX_GROUPS] = {0}, fail[MAX_GROUPS] = {0}, nj = 0, nf = 0, nfail_rows = 0;
    for (int i = 0; i < x->n; i++) {
        const sbp_diag_row *r = &x->rows[i];
        int g = group_of(r, L);
        if (g < 0 || !r->judged) continue;
        nj += judged[g]++ == 0;
        if (r->failed) nf += fail[g]++ == 0, nfail_rows++;
    }
    if (!nf) return;
    if (nf == nj) {
        if (nj > 1 && !explained) {
            char loss[200];
            loss_note(loss, sizeof loss, x->in, 0);
            sbp_diag_add(d, "top",
                         "every layer, the embedding and the head fail and no single factor "
                         "explains it: an error at the top of the backward (the loss or the "
                         "objective's per-token weights, the head, the final norm) reaches every "
                         "tensor%s",
                         loss);
        }
        return;
    }
    int emb = L, fnorm = L + 1, head = L + 2, lowest = -1, highest = -1;
    for (int l = 0; l < L; l++)
        if (fail[l]) highest = l, lowest = lowest < 0 ? l : lowest;
    int bottom = lowest == 0 && !fail[fnorm] && !fail[head] && (fail[emb] || !judged[emb]);
    for (int l = 0; l <= highest && bottom; l++) bottom = fail[l] > 0;
    int all_layers = highest >= 0;
    for (int l = 0; l < L; l++) all_layers &= fail[l] > 0 || !judged[l];
    if (bottom && all_layers) {
        sbp_diag_add(d, "layers",
                     "every layer and the embedding fail, the final norm and the head pass: the "
                     "error enters the backward below the head (the final norm's input gradient, "
                     "or layer %d)",
                     L - 1);
        return;
    }
    if (all_layers) return; /* not where, but what: the kinds rule says it */
    if (bottom) {
        char k[32];
        snprintf(k, sizeof k, highest ? "layers 0-%d" : "layer 0", highest);
        sbp_diag_add(d, "layers",
                     "%s and the embedding fail, every layer above passes: the error enters the "
                     "backward at layer %d (its weight gradients, or the input gradient it gets "
                     "from layer %d) and flows down to the embedding",
                     k, highest, highest + 1);
        return;
    }
    char what[360] = "";
    if (highest >= 0) layer_list(what, sizeof what, fail, L);
    static const char *other[] = {"the embedding", "the final norm", "lm_head"};
    for (int j = 0; j < 3; j++)
        if (fail[L + j])
            snprintf(what + strlen(what), sizeof what - strlen(what), "%s%s", what[0] ? ", " : "",
                     other[j]);
    char hint[240] = "";
    if (highest >= 0 && judged[emb] && !fail[emb])
        snprintf(hint, sizeof hint,
                 ": the embedding passes, so no wrong input gradient flows down; look at the "
                 "failing layers' own weight-gradient steps");
    else if (highest < 0 && fail[emb] && !fail[head] && !fail[fnorm] && x->in->tied == 1)
        snprintf(hint, sizeof hint,
                 ": tied embeddings make this tensor the embedding scatter-add plus the head's "
                 "gradient; is one of the two missing or counted twice?");
    else if (highest < 0 && fail[head] && !fail[emb] && !fail[fnorm])
        snprintf(hint, sizeof hint,
                 ": the head's own weight gradient (the input gradient it hands down is right, "
                 "or everything below would fail)");
    sbp_diag_add(d, "layers", "only %s fail%s (%d tensor%s); every other part passes%s", what,
                 nf > 1 ? "" : "s", nfail_rows, nfail_rows > 1 ? "s" : "", hint);
}

/* kinds: failures confined to some kinds of layer tensor */
static void rule_kinds(sbp_diagnosis *d, const ctx *x) {
    int judged[SBP_P_NKINDS] = {0}, fail[SBP_P_NKINDS] = {0};
    int layer_fail[MAX_GROUPS] = {0}, layers_judged = 0, layers_failing = 0, seen[MAX_GROUPS] = {0};
    for (int i = 0; i < x->n; i++) {
        const sbp_diag_row *r = &x->rows[i];
        if (r->layer < 0 || r->layer >= MAX_GROUPS || r->kind < 0 || !r->judged) continue;
        judged[r->kind]++;
        layers_judged += seen[r->layer]++ == 0;
        if (r->failed) fail[r->kind]++, layers_failing += layer_fail[r->layer]++ == 0;
    }
    int nk_j = 0, nk_f = 0;
    unsigned set = 0;
    for (int k = 0; k < SBP_P_NKINDS; k++) {
        nk_j += judged[k] > 0, nk_f += fail[k] > 0;
        if (fail[k]) set |= 1u << k;
    }
    if (!nk_f || nk_f == nk_j) return;
    char names[240] = "";
    for (int k = 0, listed = 0; k < SBP_P_NKINDS; k++) {
        if (!fail[k]) continue;
        const char *sep = listed == 0 ? "" : listed == nk_f - 1 ? " and " : ", ";
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", sep, kind_names[k]);
        listed++;
    }
#define B(k) (1u << (k))
    const unsigned kv = B(SBP_P_K) | B(SBP_P_KB) | B(SBP_P_V) | B(SBP_P_VB) | B(SBP_P_KNORM),
                   q = B(SBP_P_Q) | B(SBP_P_QB) | B(SBP_P_QNORM),
                   bias = B(SBP_P_QB) | B(SBP_P_KB) | B(SBP_P_VB),
                   norm = B(SBP_P_QNORM) | B(SBP_P_KNORM) | B(SBP_P_IN_NORM) | B(SBP_P_POST_NORM) |
                          B(SBP_P_PRE_FF_NORM) | B(SBP_P_POST_FF_NORM),
                   mlp = B(SBP_P_GATE) | B(SBP_P_UP) | B(SBP_P_DOWN), attn = kv | q | B(SBP_P_O);
#undef B
    const char *hint = (set & ~kv) == 0  ? ": the K/V path (in StreamBP dK and dV accumulate over "
                                           "every chunk's queries)"
                       : (set & ~q) == 0 ? ": the query path"
                       : (set & ~bias) == 0 ? ": biases (each is the sum over tokens of its "
                                              "output's gradient)"
                       : (set & ~norm) == 0 ? ": norm weights (each is the sum over tokens of dY "
                                              "times the normalised input: the RMSNorm backward "
                                              "or its upcast)"
                       : (set & ~mlp) == 0  ? ": the MLP"
                       : (set & ~attn) == 0 ? ": attention"
                                            : "";
    char where[64];
    if (layers_failing == layers_judged)
        snprintf(where, sizeof where, "in every layer");
    else
        snprintf(where, sizeof where, "in %d of %d layers", layers_failing, layers_judged);
    sbp_diag_add(d, "kinds", "only %s fail %s; the other kinds of tensor pass%s", names, where,
                 hint);
}

void sbp_diagnose(sbp_diagnosis *d, const sbp_diag_row *rows, int n, const sbp_diag_input *in) {
    memset(d, 0, sizeof *d);
    ctx x = {.rows = rows, .n = n, .in = in};
    for (int i = 0; i < n; i++) x.L = rows[i].layer + 1 > x.L ? rows[i].layer + 1 : x.L;
    if (!(x.is_pure = calloc((size_t)(n ? n : 1), sizeof *x.is_pure))) return;
    rule_names(d, &x);
    rule_nonfinite(d, &x);
    int explained = rule_scale(d, &x);
    explained |= rule_precision(d, &x);
    rule_layers(d, &x, explained);
    rule_kinds(d, &x);
    free(x.is_pure);
}
