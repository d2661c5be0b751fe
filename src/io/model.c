/* model.c — loading a HF model directory into one parameter slab, and writing a seeded random
 * model directory (`streambp init`).
 *
 * A directory holds config.json and either model.safetensors or the shards listed by
 * model.safetensors.index.json ({"weight_map": {tensor name: shard file}}). Every tensor of the
 * parameter table must be present with exactly the shape the config implies; tensors the model
 * does not use (a duplicated lm_head.weight under tied embeddings, rotary buffers) are ignored. */
#include "../core/err.h"
#include "../core/rng.h"
#include "../streambp.h"
#include "file.h"
#include "json.h"
#include "safetensors.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PATH_MAX_LEN 4096

/* Present, whatever its type: sbp_st_open says what is wrong with one that is not a file. */
static int file_exists(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0;
}

/* The shard files of a model directory: one file, or the distinct files of the index. */
typedef struct {
    sbp_st_file *files;
    int n;
} shard_set;

static void shards_close(shard_set *s) {
    for (int i = 0; i < s->n; i++) sbp_st_close(&s->files[i]);
    free(s->files);
    memset(s, 0, sizeof *s);
}

static sbp_status shards_open(shard_set *s, const char *dir, sbp_err *err) {
    memset(s, 0, sizeof *s);
    char path[PATH_MAX_LEN];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (file_exists(path)) {
        s->files = calloc(1, sizeof *s->files);
        if (!s->files) return sbp_fail(err, SBP_ENOMEM, "out of memory");
        sbp_status st = sbp_st_open(&s->files[0], path, err);
        if (st)
            shards_close(s);
        else
            s->n = 1;
        return st;
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (!file_exists(path))
        return sbp_fail(err, SBP_EIO,
                        "%s: no model.safetensors and no model.safetensors.index.json", dir);
    char *text = NULL;
    size_t n_text = 0;
    sbp_status st = sbp_read_text(&text, &n_text, path, 64u << 20, err);
    if (st) return st;
    cJSON *root;
    st = sbp_json_parse(&root, text, n_text, path, err);
    free(text);
    if (st) return st;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return sbp_fail(err, SBP_EFORMAT, "%s: not a JSON object with a \"weight_map\" object",
                        path);
    }
    s->files = calloc((size_t)cJSON_GetArraySize(map) + 1, sizeof *s->files);
    if (!s->files) st = sbp_fail(err, SBP_ENOMEM, "out of memory");
    const cJSON *kv;
    cJSON_ArrayForEach(kv, map) {
        if (st) break;
        const char *shard = cJSON_GetStringValue(kv);
        if (!shard || strchr(shard, '/')) {
            st = sbp_fail(err, SBP_EFORMAT,
                          "%s: weight_map[\"%s\"] is not a file name in the "
                          "model directory",
                          path, kv->string);
            break;
        }
        char spath[PATH_MAX_LEN];
        snprintf(spath, sizeof spath, "%s/%s", dir, shard);
        int seen = 0;
        for (int i = 0; i < s->n && !seen; i++) seen = strcmp(s->files[i].path, spath) == 0;
        if (!seen && (st = sbp_st_open(&s->files[s->n], spath, err)) == SBP_OK) s->n++;
    }
    cJSON_Delete(root);
    if (st) shards_close(s);
    return st;
}

static const sbp_st_tensor *shards_find(const shard_set *s, const char *name, int *which) {
    for (int i = 0; i < s->n; i++) {
        const sbp_st_tensor *t = sbp_st_find(&s->files[i], name);
        if (t) {
            *which = i;
            return t;
        }
    }
    return NULL;
}

/* The tensor for parameter p, with its shape checked against the config. A multimodal gemma3
 * directory (cfg.wrapped) names the text model's tensors "language_model." + its own names
 * (Gemma3ForConditionalGeneration.language_model is a Gemma3ForCausalLM); the vision tower and
 * the projector are never read. */
static sbp_status find_tensor(const sbp_st_tensor **out, int *which, const shard_set *shards,
                              const sbp_param *p, int wrapped, const char *dir, sbp_err *err) {
    char name[128];
    snprintf(name, sizeof name, "%s%s", wrapped ? "language_model." : "", p->name);
    const sbp_st_tensor *t = shards_find(shards, name, which);
    if (!t) return sbp_fail(err, SBP_EINPUT, "%s: the model has no tensor \"%s\"", dir, name);
    int same = t->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
    if (!same) {
        char want[64], got[128] = "";
        if (p->ndim == 2)
            snprintf(want, sizeof want, "[%lld, %lld]", (long long)p->shape[0],
                     (long long)p->shape[1]);
        else
            snprintf(want, sizeof want, "[%lld]", (long long)p->shape[0]);
        for (int d = 0; d < t->ndim; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
                     (long long)t->shape[d]);
        return sbp_fail(err, SBP_EINPUT,
                        "%s: tensor \"%s\" has shape [%s] but config.json implies %s",
                        shards->files[*which].path, p->name, got, want);
    }
    *out = t;
    return SBP_OK;
}

/* The part of loading that reads no weight: config.json, the parameter table, the shards'
 * headers, and every tensor found with its shape checked, so that a config that disagrees with
 * the weights is reported as such, not as an allocation failure. On success m holds cfg and
 * params, and src[i], file[i] locate parameter i (free both, close the shards). */
static sbp_status open_model(sbp_model *m, shard_set *shards, const sbp_st_tensor ***src,
                             int **file, const char *dir, sbp_err *err) {
    char path[PATH_MAX_LEN];
    struct stat sb;
    *src = NULL, *file = NULL;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return sbp_fail(err, SBP_EIO, "%s: model directory does not exist or is not a directory",
                        dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    sbp_status st = sbp_config_load(&m->cfg, path, err);
    if (st) return st;
    if ((st = sbp_params_build(&m->params, &m->cfg, err))) return st;
    if ((st = shards_open(shards, dir, err))) {
        sbp_params_free(&m->params);
        return st;
    }
    *src = calloc((size_t)m->params.n, sizeof **src);
    *file = calloc((size_t)m->params.n, sizeof **file);
    if (!*src || !*file) st = sbp_fail(err, SBP_ENOMEM, "out of memory");
    for (int i = 0; i < m->params.n && !st; i++)
        st =
            find_tensor(&(*src)[i], &(*file)[i], shards, &m->params.p[i], m->cfg.wrapped, dir, err);
    if (st) {
        free(*src), free(*file);
        *src = NULL, *file = NULL;
        shards_close(shards);
        sbp_params_free(&m->params);
    }
    return st;
}

sbp_status sbp_model_check(sbp_config *cfg, const char *dir, sbp_err *err) {
    sbp_model m;
    memset(&m, 0, sizeof m);
    shard_set shards;
    const sbp_st_tensor **src;
    int *file;
    sbp_status st = open_model(&m, &shards, &src, &file, dir, err);
    if (st) return st;
    *cfg = m.cfg;
    free(src), free(file);
    shards_close(&shards);
    sbp_params_free(&m.params);
    return SBP_OK;
}

sbp_status sbp_model_load(sbp_model *m, const char *dir, sbp_precision prec, sbp_ledger *lg,
                          sbp_err *err) {
    memset(m, 0, sizeof *m);
    if (lg && lg->plan) /* its buffers are reserved address space, not memory to load into */
        return sbp_fail(err, SBP_EUSAGE,
                        "a planning ledger (sbp_ledger.plan set) cannot hold a model's weights");
    shard_set shards;
    const sbp_st_tensor **src;
    int *file;
    sbp_status st = open_model(m, &shards, &src, &file, dir, err);
    if (st) return st;
    size_t esz = prec == SBP_FP64 ? sizeof(double) : sizeof(float);
    m->prec = prec;
    if (!(m->w = sbp_ledger_alloc(lg, SBP_MEM_WEIGHTS, esz * (size_t)m->params.total)))
        st = sbp_fail(err, SBP_ENOMEM, "%s: out of memory for %lld parameters", dir,
                      (long long)m->params.total);
    for (int i = 0; i < m->params.n && !st; i++) {
        const sbp_param *p = &m->params.p[i];
        const sbp_st_file *sf = &shards.files[file[i]];
        void *dst = (char *)m->w + esz * (size_t)p->offset;
        st = sbp_st_read(sf, src[i], dst, prec == SBP_FP64 ? SBP_DT_F64 : SBP_DT_F32, err);
        for (int64_t j = 0; j < p->numel && !st; j++) {
            double v = prec == SBP_FP64 ? ((double *)dst)[j] : ((float *)dst)[j];
            if (!isfinite(v))
                st = sbp_fail(
                    err, SBP_EINPUT, "%s: tensor \"%s\" element %lld is not finite (%g%s)",
                    sf->path, p->name, (long long)j, v,
                    prec == SBP_FP32 && src[i]->dtype == SBP_DT_F64 ? " after rounding to fp32"
                                                                    : "");
        }
    }
    free(src);
    free(file);
    shards_close(&shards);
    if (st) sbp_model_free(m, lg);
    return st;
}

void sbp_model_round_bf16(sbp_model *m) {
    for (int64_t i = 0; i < m->params.total; i++) {
        if (m->prec == SBP_FP64) {
            double *w = m->w;
            w[i] = sbp_bf16_to_f32(sbp_f32_to_bf16((float)w[i]));
        } else {
            float *w = m->w;
            w[i] = sbp_bf16_to_f32(sbp_f32_to_bf16(w[i]));
        }
    }
}

void sbp_model_free(sbp_model *m, sbp_ledger *lg) {
    sbp_ledger_free(lg, m->w);
    sbp_params_free(&m->params);
    memset(m, 0, sizeof *m);
}

sbp_status sbp_model_init(const sbp_config *cfg, uint64_t seed, const char *dir, sbp_err *err) {
    sbp_params ps;
    sbp_status st = sbp_params_build(&ps, cfg, err); /* a bad config creates no directory */
    if (st) return st;
    if ((st = sbp_make_dirs(dir, err))) {
        sbp_params_free(&ps);
        return st;
    }
    float *w = malloc(sizeof *w * (size_t)ps.total);
    sbp_st_entry *e = calloc((size_t)ps.n, sizeof *e);
    if (!w || !e) {
        free(w);
        free(e);
        sbp_params_free(&ps);
        return sbp_fail(err, SBP_ENOMEM, "out of memory for %lld parameters (%.1f GiB in float32)",
                        (long long)ps.total, 4.0 * (double)ps.total / 1073741824.0);
    }
    /* Matrices ~ N(0, initializer_range) as HF initialises them; norm weights 1 + 0.1 N(0,1) and
     * biases 0.1 N(0,1) rather than HF's constants 1 and 0, so that their gradients are
     * exercised by every check. Gemma-3's norms scale by (1 + w) and HF zero-initialises w:
     * their w is 0.1 N(0,1), the same scales. Each tensor has its own stream, so a tensor's
     * values do not depend on which other tensors the family has. */
    const double norm_mean = cfg->family == SBP_GEMMA3 ? 0.0 : 1.0;
    for (int i = 0; i < ps.n; i++) {
        const sbp_param *p = &ps.p[i];
        sbp_rng r;
        uint64_t h = seed;
        for (const char *c = p->name; *c; c++) h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
        sbp_rng_seed(&r, h);
        int norm = p->kind == SBP_P_QNORM || p->kind == SBP_P_KNORM || p->kind == SBP_P_IN_NORM ||
                   p->kind == SBP_P_POST_NORM || p->kind == SBP_P_FINAL_NORM ||
                   p->kind == SBP_P_PRE_FF_NORM || p->kind == SBP_P_POST_FF_NORM;
        int bias = p->kind == SBP_P_QB || p->kind == SBP_P_KB || p->kind == SBP_P_VB;
        for (int64_t j = 0; j < p->numel; j++) {
            double z = sbp_rng_normal(&r);
            w[p->offset + j] = (float)(norm   ? norm_mean + 0.1 * z
                                       : bias ? 0.1 * z
                                              : cfg->init_range * z);
        }
        e[i] = (sbp_st_entry){.name = p->name,
                              .dtype = SBP_DT_F32,
                              .ndim = p->ndim,
                              .shape = {p->shape[0], p->shape[1]},
                              .data = w + p->offset};
    }
    char path[PATH_MAX_LEN], seedtxt[32];
    snprintf(seedtxt, sizeof seedtxt, "%llu", (unsigned long long)seed);
    const char *meta[] = {"format", "pt", "generator", "streambp init", "seed", seedtxt, NULL};
    snprintf(path, sizeof path, "%s/config.json", dir);
    st = sbp_config_save(cfg, path, err);
    if (!st) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        st = sbp_st_write(path, e, ps.n, meta, err);
    }
    free(w);
    free(e);
    sbp_params_free(&ps);
    return st;
}
