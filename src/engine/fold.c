/* fold.c — a micro-batch's gradient a bucket at a time (fold.h). Compiled once per precision. */
#include "fold.h"

#include <stdio.h>
#include <stdlib.h>

/* Points bucket id's gradient views at buf, which holds the slab's elements [off, off + n). */
static void point(eng *e, struct grad_fold *f, int id, real *buf, int64_t off) {
    if (id >= 0 && f->lps)
        adapter_views(&e->g[id], buf, off, f->lps, id);
    else if (id >= 0)
        layer_views(&e->g[id], buf, off, f->mps, id);
    else if (id == SBP_BUCKET_HEAD) {
        e->gfnorm = slab_view(buf, off, f->mps, SBP_P_FINAL_NORM, -1);
        if (!f->tied) e->ghead = slab_view(buf, off, f->mps, SBP_P_LM_HEAD, -1);
    } else {
        e->gemb = slab_view(buf, off, f->mps, SBP_P_EMBED, -1);
        if (f->tied) e->ghead = e->gemb;
    }
}

static real *buffer_of(const struct grad_fold *f, int id) {
    if (id == SBP_BUCKET_HEAD && f->hscratch) return f->hscratch;
    return id == SBP_BUCKET_EMBED && f->tied ? f->escratch : f->scratch;
}

/* Bucket id's gradient from zero in its scratch. */
static void open_bucket(eng *e, struct grad_fold *f, int id) {
    const sbp_bucket *bk = sbp_bucket_find(f->b, f->nb, id);
    if (!bk) return; /* nothing trained there (LoRA: only the layers) */
    real *buf = buffer_of(f, id);
    e->ops->zero(e, buf, (size_t)bk->n);
    point(e, f, id, buf, bk->off);
}

void bucket_begin(eng *e, int id) {
    struct grad_fold *f = e->fold;
    if (!f || f->failed || (id == SBP_BUCKET_EMBED && f->tied))
        return; /* a tied embedding began with the head */
    open_bucket(e, f, id);
    if (id == SBP_BUCKET_HEAD && f->tied) open_bucket(e, f, SBP_BUCKET_EMBED);
}

void bucket_begin_apart(eng *e, int id) {
    struct grad_fold *f = e->fold;
    const sbp_bucket *bk = f ? sbp_bucket_find(f->b, f->nb, id) : NULL;
    if (bk && !f->failed && id == SBP_BUCKET_HEAD)
        f->hscratch = ealloc(e, SBP_MEM_GRADS, (size_t)bk->n, "head bucket's own scratch");
    if (!e->oom) bucket_begin(e, id);
}

int bucket_items(const eng *e, int id, relay_item *it) {
    struct grad_fold *f = e->fold;
    int n = 0;
    if (!f) return 0;
    const sbp_bucket *bk = sbp_bucket_find(f->b, f->nb, id);
    if (bk) it[n++] = (relay_item){buffer_of(f, id), sizeof(real) * (size_t)bk->n};
    const sbp_bucket *eb = sbp_bucket_find(f->b, f->nb, SBP_BUCKET_EMBED);
    if (id == SBP_BUCKET_HEAD && f->tied && eb)
        it[n++] = (relay_item){f->escratch, sizeof(real) * (size_t)eb->n};
    return n;
}

static int complete_bucket(eng *e, struct grad_fold *f, int id) {
    if (f->failed) return 0;    /* the hook's first failure stands: nothing more is handed on */
    if (!seq_last(e)) return 1; /* its sum went on to the ranks after this one */
    const sbp_bucket *bk = sbp_bucket_find(f->b, f->nb, id);
    if (!bk) return 1;
    real *buf = buffer_of(f, id);
    e->ops->store(e, buf, (size_t)bk->n); /* rounded as a whole step's gradient is */
    if (f->hook) {
        if (!f->hook(f->hook_ctx, bk->off, bk->n, buf)) f->failed = 1;
    } else {
        e->ops->add(e, f->S + bk->off, f->S + bk->off, buf, (size_t)bk->n); /* S ← S + g */
    }
    return !f->failed;
}

int bucket_end(eng *e, int id) {
    struct grad_fold *f = e->fold;
    return f ? complete_bucket(e, f, id) : 1;
}

void bucket_free_apart(eng *e) {
    struct grad_fold *f = e->fold;
    if (f) efree(e, f->hscratch), f->hscratch = NULL;
}

int fold_begin(eng *e, struct grad_fold *f, const sbp_model *m, const sbp_lora *lora, real *S,
               sbp_bucket_hook hook, void *hook_ctx) {
    const sbp_params *gps = lora ? &lora->params : &m->params;
    *f = (struct grad_fold){.S = S,
                            .tied = m->cfg.tied && !lora,
                            .mps = &m->params,
                            .lps = lora ? &lora->params : NULL,
                            .hook = hook,
                            .hook_ctx = hook_ctx};
    e->fold = f; /* fold_end frees what this allocated, whatever fails */
    const int cap = m->cfg.layers + 2;
    f->b = malloc(sizeof *f->b * (size_t)cap);
    if (!f->b || (f->nb = sbp_grad_buckets(f->b, cap, gps)) < 0) {
        snprintf(e->oom_what, sizeof e->oom_what, "gradient buckets");
        return e->oom = 1, 0;
    }
    int64_t most = 0, emb = 0;
    for (int i = 0; i < f->nb; i++)
        if (f->tied && f->b[i].id == SBP_BUCKET_EMBED)
            emb = f->b[i].n;
        else if (f->b[i].n > most)
            most = f->b[i].n;
    f->scratch = ealloc(e, SBP_MEM_GRADS, (size_t)most, "bucket scratch of the fold");
    if (emb) f->escratch = ealloc(e, SBP_MEM_GRADS, (size_t)emb, "embedding scratch of the fold");
    return !e->oom;
}

void fold_end(eng *e, struct grad_fold *f) {
    efree(e, f->hscratch), efree(e, f->escratch), efree(e, f->scratch);
    free(f->b);
    e->fold = NULL;
}
