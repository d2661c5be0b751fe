/* load.c — the library's reading of the inputs against the oracle's (see load.h). */
#include "load.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void note(char *notes, size_t n, int *count, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void note(char *notes, size_t n, int *count, const char *fmt, ...) {
    (*count)++;
    size_t len = strlen(notes);
    if (len + 4 >= n) return;
    if (len) len += (size_t)snprintf(notes + len, n - len, "; ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(notes + len, n - len, fmt, ap);
    va_end(ap);
}

static void compare_config(char *notes, size_t n, int *bad, const sbp_config *a,
                           const sbp_config *b) {
    const struct {
        const char *name;
        double lib, ref;
    } f[] = {
        {"model family", a->family, b->family},
        {"vocab_size", a->vocab, b->vocab},
        {"hidden_size", a->hidden, b->hidden},
        {"intermediate_size", a->ffn, b->ffn},
        {"num_hidden_layers", a->layers, b->layers},
        {"num_attention_heads", a->heads, b->heads},
        {"num_key_value_heads", a->kv_heads, b->kv_heads},
        {"head_dim", a->head_dim, b->head_dim},
        {"rms_norm_eps", a->eps, b->eps},
        {"rope_theta", a->rope_theta, b->rope_theta},
        {"llama3 rope scaling", a->rope_llama3, b->rope_llama3},
        {"linear rope scaling", a->rope_linear, b->rope_linear},
        {"rope factor", a->rope_llama3 || a->rope_linear ? a->rope_factor : 0,
         b->rope_llama3 || b->rope_linear ? b->rope_factor : 0},
        {"rope low_freq_factor", a->rope_llama3 ? a->rope_low_freq : 0,
         b->rope_llama3 ? b->rope_low_freq : 0},
        {"rope high_freq_factor", a->rope_llama3 ? a->rope_high_freq : 0,
         b->rope_llama3 ? b->rope_high_freq : 0},
        {"rope original_max_position_embeddings", a->rope_llama3 ? a->rope_orig_max : 0,
         b->rope_llama3 ? b->rope_orig_max : 0},
        {"tie_word_embeddings", a->tied, b->tied},
        {"q/k/v bias", a->qkv_bias, b->qkv_bias},
        {"q/k norm", a->qk_norm, b->qk_norm},
        {"pad_token_id", a->pad_token_id, b->pad_token_id},
        /* Gemma-3's fields (docs/gemma3.md, "Config"); the other families leave them 0 */
        {"sliding_window", a->sliding_window, b->sliding_window},
        {"sliding_window_pattern", a->sliding_window_pattern, b->sliding_window_pattern},
        {"rope_local_base_freq", a->rope_local_theta, b->rope_local_theta},
        {"query_pre_attn_scalar", a->query_pre_attn_scalar, b->query_pre_attn_scalar},
        {"multimodal gemma3 wrapper", a->wrapped, b->wrapped},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].lib != f[i].ref)
            note(notes, n, bad, "config.json %s: library %.17g, oracle %.17g", f[i].name, f[i].lib,
                 f[i].ref);
}

static void compare_params(sbp_verify_group *g, char *notes, size_t n, int *bad, const sbp_model *m,
                           const ref_model *rm) {
    const double *w = m->w;
    for (int i = 0; i < m->params.n && i < g->n_rows; i++) {
        const sbp_param *p = &m->params.p[i];
        sbp_verify_row *row = &g->rows[i];
        row->runs = 1;
        const char *why = NULL;
        int j = -1;
        for (int k = 0; k < rm->ps.n && j < 0; k++)
            if (strcmp(rm->ps.p[k].name, p->name) == 0) j = k;
        if (j < 0) {
            why = "the oracle's table has no such tensor";
        } else if (rm->ps.p[j].ndim != p->ndim || rm->ps.p[j].shape[0] != p->shape[0] ||
                   rm->ps.p[j].shape[1] != p->shape[1]) {
            why = "its shape differs";
        } else if (memcmp(w + p->offset, rm->w + rm->ps.p[j].offset,
                          sizeof(double) * (size_t)p->numel) != 0) {
            why = "its weights differ";
        } else {
            row->bitwise_runs = 1;
        }
        if (why) {
            row->failed = 1;
            snprintf(row->first_failure, sizeof row->first_failure, "%s", why);
            (*bad)++;
        }
    }
    for (int k = 0; k < rm->ps.n; k++)
        if (sbp_params_find(&m->params, rm->ps.p[k].name) < 0)
            note(notes, n, bad, "tensor %s: the oracle's table has it, the library's does not",
                 rm->ps.p[k].name);
}

/* The first index where two optional arrays differ by more than tol (relative), or -1. */
static long first_diff(const double *a, const double *b, size_t n, double tol) {
    for (size_t i = 0; i < n; i++)
        if (!(fabs(a[i] - b[i]) <= tol * fmax(1, fmax(fabs(a[i]), fabs(b[i]))))) return (long)i;
    return -1;
}

static void compare_doubles(char *notes, size_t n, int *bad, const char *what, const double *a,
                            const double *b, size_t len, int T, double tol) {
    if (!a && !b) return;
    if (!a || !b) {
        note(notes, n, bad, "%s: %s has them, the %s does not", what,
             a ? "the library" : "the oracle", a ? "oracle" : "library");
        return;
    }
    long i = first_diff(a, b, len, tol);
    if (i < 0) return;
    if (T)
        note(notes, n, bad,
             "%s differ, first at row %ld, position %ld: library %.17g, oracle %.17g", what, i / T,
             i % T, a[i], b[i]);
    else
        note(notes, n, bad, "%s differ, first at row %ld: library %.17g, oracle %.17g", what, i,
             a[i], b[i]);
}

static void compare_batch(char *notes, size_t n, int *bad, const sbp_batch *a, const sbp_batch *b) {
    if (a->B != b->B || a->T != b->T || a->pairs != b->pairs) {
        note(notes, n, bad,
             "batch shape: library %d rows of %d (%d pairs), oracle %d rows of %d "
             "(%d pairs)",
             a->B, a->T, a->pairs, b->B, b->T, b->pairs);
        return;
    }
    const size_t N = (size_t)a->B * a->T;
    for (size_t i = 0; i < N; i++) {
        const char *what = a->ids[i] != b->ids[i]         ? "input_ids"
                           : a->labels[i] != b->labels[i] ? "labels (the targets)"
                           : a->mask[i] != b->mask[i]     ? "attention_mask"
                                                          : NULL;
        if (what) {
            note(notes, n, bad,
                 "batch %s differ, first at row %zu, position %zu: library %d, oracle %d", what,
                 i / a->T, i % a->T,
                 a->ids[i] != b->ids[i]         ? a->ids[i]
                 : a->labels[i] != b->labels[i] ? a->labels[i]
                                                : a->mask[i],
                 a->ids[i] != b->ids[i]         ? b->ids[i]
                 : a->labels[i] != b->labels[i] ? b->labels[i]
                                                : b->mask[i]);
            break;
        }
    }
    if (a->n_targets != b->n_targets)
        note(notes, n, bad, "the number of targets (a normaliser): library %lld, oracle %lld",
             (long long)a->n_targets, (long long)b->n_targets);
    /* computed values: equal up to the order of a few float64 operations */
    compare_doubles(notes, n, bad, "advantages", a->advantages, b->advantages, (size_t)a->B, 0,
                    1e-12);
    compare_doubles(notes, n, bad, "old_logps (by predicting position)", a->old_logps, b->old_logps,
                    N, a->T, 0);
    compare_doubles(notes, n, bad, "ref_logps (by predicting position)", a->ref_logps, b->ref_logps,
                    N, a->T, 1e-9);
    compare_doubles(notes, n, bad, "reference log-probs per row", a->ref_seq_logps,
                    b->ref_seq_logps, (size_t)a->B, 0, 1e-9);
}

int sbp_verify_compare_inputs(sbp_verify_group *g, char *notes, size_t n_notes, const sbp_model *m,
                              const sbp_batch *b, const ref_model *rm, const sbp_batch *rb) {
    int bad = 0;
    g->runs = 1;
    compare_config(notes, n_notes, &bad, &m->cfg, &rm->cfg);
    compare_params(g, notes, n_notes, &bad, m, rm);
    compare_batch(notes, n_notes, &bad, b, rb);
    return bad;
}
