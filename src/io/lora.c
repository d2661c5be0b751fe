/* lora.c — LoRA adapters in peft's layout: the adapter tensors of a model, peft's
 * initialisation, and adapter directories (adapter_config.json + adapter_model.safetensors).
 *
 * peft names a wrapped model's modules "base_model.model." + the HF name, and an adapter's
 * tensors "<module>.lora_A.weight" (r, in) and "<module>.lora_B.weight" (out, r); the file
 * holds them without the adapter's name ("default"), which is how peft saves and loads them. */
#include "../core/err.h"
#include "../core/rng.h"
#include "../streambp.h"
#include "file.h"
#include "json.h"
#include "lora.h"
#include "safetensors.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The projections an adapter can sit on, in a layer's order, with their peft module names. */
static const struct {
    unsigned bit;
    sbp_param_kind kind;
    const char *module; /* under model.layers.L. */
    const char *short_name;
} targets[] = {
    {SBP_LORA_Q, SBP_P_Q, "self_attn.q_proj", "q_proj"},
    {SBP_LORA_K, SBP_P_K, "self_attn.k_proj", "k_proj"},
    {SBP_LORA_V, SBP_P_V, "self_attn.v_proj", "v_proj"},
    {SBP_LORA_O, SBP_P_O, "self_attn.o_proj", "o_proj"},
    {SBP_LORA_GATE, SBP_P_GATE, "mlp.gate_proj", "gate_proj"},
    {SBP_LORA_UP, SBP_P_UP, "mlp.up_proj", "up_proj"},
    {SBP_LORA_DOWN, SBP_P_DOWN, "mlp.down_proj", "down_proj"},
};
enum { N_TARGETS = sizeof targets / sizeof targets[0] };

double sbp_lora_scaling(const sbp_lora_config *c) {
    return c->use_rslora ? c->alpha / sqrt((double)c->r) : c->alpha / c->r;
}

int sbp_lora_targets_parse(const char *s, unsigned *out) {
    if (strcmp(s, "all-linear") == 0) {
        *out = SBP_LORA_ALL;
        return 1;
    }
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    unsigned bits = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (int i = 0; i < N_TARGETS; i++)
            if (strcmp(tok, targets[i].short_name) == 0) bits |= targets[i].bit, found = 1;
        if (!found) return 0;
    }
    *out = bits;
    return bits != 0;
}

/* in and out features of the projection of kind k */
static void features(const sbp_config *c, sbp_param_kind k, int64_t *in, int64_t *out) {
    const int64_t C = c->hidden, F = c->ffn, Q = (int64_t)c->heads * c->head_dim;
    const int64_t KV = (int64_t)c->kv_heads * c->head_dim;
    switch (k) {
    case SBP_P_Q: *in = C, *out = Q; break;
    case SBP_P_K:
    case SBP_P_V: *in = C, *out = KV; break;
    case SBP_P_O: *in = Q, *out = C; break;
    case SBP_P_DOWN: *in = F, *out = C; break;
    default: *in = C, *out = F; break; /* gate, up */
    }
}

static sbp_status check_config(const sbp_lora_config *c, sbp_err *err) {
    if (c->r < 1 || c->r > SBP_MAX_LORA_R)
        return sbp_fail(err, SBP_EUSAGE, "the LoRA rank r must be in [1, %d] (got %d)",
                        SBP_MAX_LORA_R, c->r);
    if (!(c->alpha > 0) || !isfinite(c->alpha))
        return sbp_fail(err, SBP_EUSAGE, "lora_alpha must be > 0 and finite (got %g)", c->alpha);
    if (!c->targets || (c->targets & ~(unsigned)SBP_LORA_ALL))
        return sbp_fail(err, SBP_EUSAGE, "no LoRA target module (q_proj, ..., down_proj)");
    return SBP_OK;
}

sbp_status sbp_lora_params_build(sbp_params *ps, const sbp_config *cfg, const sbp_lora_config *c,
                                 sbp_err *err) {
    memset(ps, 0, sizeof *ps);
    sbp_status st = check_config(c, err);
    if (st) return st;
    ps->p = calloc((size_t)cfg->layers * 2 * N_TARGETS + 1, sizeof *ps->p);
    if (!ps->p) return sbp_fail(err, SBP_ENOMEM, "out of memory for the adapter's tensor table");
    for (int l = 0; l < cfg->layers; l++)
        for (int t = 0; t < N_TARGETS; t++) {
            if (!(c->targets & targets[t].bit)) continue;
            int64_t in, out;
            features(cfg, targets[t].kind, &in, &out);
            for (int ab = 1; ab <= 2; ab++) {
                sbp_param *p = &ps->p[ps->n++];
                snprintf(p->name, sizeof p->name,
                         "base_model.model.model.layers.%d.%s.lora_%c.weight", l, targets[t].module,
                         ab == 1 ? 'A' : 'B');
                p->kind = targets[t].kind, p->layer = l, p->lora = ab, p->ndim = 2;
                p->shape[0] = ab == 1 ? c->r : out;
                p->shape[1] = ab == 1 ? in : c->r;
                p->numel = p->shape[0] * p->shape[1];
                p->offset = ps->total;
                ps->total += p->numel;
            }
        }
    return SBP_OK;
}

static sbp_status alloc_slab(sbp_lora *a, sbp_precision prec, sbp_ledger *lg, sbp_err *err) {
    const size_t esz = prec == SBP_FP64 ? sizeof(double) : sizeof(float);
    a->prec = prec;
    a->w = sbp_ledger_alloc(lg, SBP_MEM_WEIGHTS,
                            esz * (size_t)(a->params.total ? a->params.total : 1));
    if (!a->w)
        return sbp_fail(err, SBP_ENOMEM, "out of memory for the adapter (%lld parameters)",
                        (long long)a->params.total);
    return SBP_OK;
}

static void set(sbp_lora *a, int64_t i, double v) {
    if (a->prec == SBP_FP64)
        ((double *)a->w)[i] = v;
    else
        ((float *)a->w)[i] = (float)v;
}

/* The first element of the adapter that is NaN or infinite, named by tensor and index, as an
 * error about `what`; SBP_OK when every element is finite. */
static sbp_status check_finite(const sbp_lora *a, const char *what, sbp_err *err) {
    for (int i = 0; i < a->params.n; i++) {
        const sbp_param *p = &a->params.p[i];
        for (int64_t j = 0; j < p->numel; j++) {
            const double v = a->prec == SBP_FP64 ? ((const double *)a->w)[p->offset + j]
                                                 : ((const float *)a->w)[p->offset + j];
            if (!isfinite(v))
                return sbp_fail(err, SBP_EINPUT,
                                "%s: \"%s\" element %lld (row %lld, column %lld) "
                                "is %g",
                                what, p->name, (long long)j, (long long)(j / p->shape[1]),
                                (long long)(j % p->shape[1]), v);
        }
    }
    return SBP_OK;
}

sbp_status sbp_lora_init(sbp_lora *a, const sbp_config *cfg, const sbp_lora_config *c,
                         uint64_t seed, double b_std, sbp_precision prec, sbp_err *err) {
    memset(a, 0, sizeof *a);
    a->cfg = *c;
    sbp_status st = sbp_lora_params_build(&a->params, cfg, c, err);
    if (!st && (b_std < 0 || !isfinite(b_std)))
        st = sbp_fail(err, SBP_EUSAGE, "the std of B must be >= 0 (got %g)", b_std);
    if (!st) st = alloc_slab(a, prec, NULL, err);
    if (st) {
        sbp_lora_free(a, NULL);
        return st;
    }
    sbp_rng r;
    sbp_rng_seed(&r, seed);
    for (int i = 0; i < a->params.n; i++) {
        const sbp_param *p = &a->params.p[i];
        /* kaiming_uniform_(A, a=√5): bound = gain·√(3/fan_in), gain = √(2/(1+5)): 1/√fan_in */
        const double bound = 1 / sqrt((double)p->shape[1]);
        for (int64_t j = 0; j < p->numel; j++)
            set(a, p->offset + j,
                p->lora == 1 ? bound * (2 * sbp_rng_uniform(&r) - 1)
                             : (b_std > 0 ? b_std * sbp_rng_normal(&r) : 0));
    }
    /* a std near the float range overflows (--b-std 1e308): no adapter with infinite weights */
    if ((st = check_finite(a, "lora init: the std of B is too large", err))) sbp_lora_free(a, NULL);
    return st;
}

void sbp_lora_free(sbp_lora *a, sbp_ledger *lg) {
    sbp_ledger_free(lg, a->w);
    sbp_params_free(&a->params);
    memset(a, 0, sizeof *a);
}

/* ---- adapter directories ------------------------------------------------------------------- */

/* A boolean field of adapter_config.json: absent or null reads as false; anything but JSON true
 * or false is an error (a string "true" is not silently false, a number not silently true). */
static sbp_status get_bool(int *out, const cJSON *j, const char *name, const char *path,
                           sbp_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    *out = 0;
    if (!v || cJSON_IsNull(v)) return SBP_OK;
    if (!cJSON_IsBool(v))
        return sbp_fail(err, SBP_EINPUT, "%s: \"%s\" must be true or false (JSON booleans)", path,
                        name);
    *out = cJSON_IsTrue(v);
    return SBP_OK;
}

/* Whether a field is set to something other than its inert value: absent, null, false, "" or an
 * empty array or object. */
static int is_set(const cJSON *v) {
    return v && !cJSON_IsNull(v) && !cJSON_IsFalse(v) &&
           !(cJSON_IsString(v) && !v->valuestring[0]) &&
           !((cJSON_IsArray(v) || cJSON_IsObject(v)) && !v->child);
}

static sbp_status read_config(sbp_lora_config *c, const char *path, sbp_err *err) {
    char *text = NULL;
    size_t n = 0;
    cJSON *j = NULL;
    sbp_status st = sbp_read_text(&text, &n, path, 1 << 20, err);
    if (!st) st = sbp_json_parse(&j, text, n, path, err);
    free(text);
    if (st) return st;
    st = sbp_lora_config_from_json(c, j, path, err);
    cJSON_Delete(j);
    return st;
}

sbp_status sbp_lora_config_from_json(sbp_lora_config *c, const cJSON *j, const char *path,
                                     sbp_err *err) {
    if (!cJSON_IsObject(j)) return sbp_fail(err, SBP_EFORMAT, "%s: not a JSON object", path);
    memset(c, 0, sizeof *c);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "peft_type");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "r");
    const cJSON *alpha = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha");
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "target_modules");
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(j, "bias");
    int rslora = 0, dora = 0, ff = 0, inference = 0, qalora = 0, lbias = 0;
    sbp_status st = SBP_OK;
    if (!st) st = get_bool(&rslora, j, "use_rslora", path, err);
    if (!st) st = get_bool(&dora, j, "use_dora", path, err);
    if (!st) st = get_bool(&ff, j, "fan_in_fan_out", path, err);
    if (!st) st = get_bool(&inference, j, "inference_mode", path, err);
    if (!st) st = get_bool(&qalora, j, "use_qalora", path, err);
    if (!st) st = get_bool(&lbias, j, "lora_bias", path, err);
    /* peft features that change the adapter's function or which modules carry it, and that this
     * implementation does not have: refused by name rather than silently ignored */
    static const char *const unsupported[] = {
        "rank_pattern",    "alpha_pattern",          "layers_to_transform", "layers_pattern",
        "modules_to_save", "exclude_modules",        "target_parameters",   "layer_replication",
        "megatron_config", "trainable_token_indices"};
    for (size_t i = 0; !st && i < sizeof unsupported / sizeof *unsupported; i++)
        if (is_set(cJSON_GetObjectItemCaseSensitive(j, unsupported[i])))
            st = sbp_fail(err, SBP_EINPUT, "%s: %s is set: not supported by streambp", path,
                          unsupported[i]);
    if (st) return st;
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "LORA") != 0)
        st = sbp_fail(err, SBP_EINPUT, "%s: peft_type is not \"LORA\"", path);
    else if (!cJSON_IsNumber(r) || !(fabs(r->valuedouble) <= 2147483647.0) ||
             r->valuedouble != floor(r->valuedouble)) /* checked before the conversion to int */
        st = sbp_fail(err, SBP_EINPUT, "%s: \"r\" is not an integer (of int range)", path);
    else if (!cJSON_IsNumber(alpha)) /* its range: check_config */
        st = sbp_fail(err, SBP_EINPUT, "%s: \"lora_alpha\" is not a number", path);
    else if ((bias && !cJSON_IsNull(bias) &&
              (!cJSON_IsString(bias) || strcmp(bias->valuestring, "none") != 0)))
        st = sbp_fail(err, SBP_EINPUT, "%s: bias \"%s\": only bias \"none\" is supported", path,
                      cJSON_IsString(bias) ? bias->valuestring : "?");
    else if (dora)
        st = sbp_fail(err, SBP_EINPUT, "%s: use_dora: DoRA adapters are not supported", path);
    else if (qalora)
        st = sbp_fail(err, SBP_EINPUT, "%s: use_qalora: QA-LoRA adapters are not supported", path);
    else if (lbias)
        st = sbp_fail(err, SBP_EINPUT,
                      "%s: lora_bias: adapters with a bias on lora_B are not "
                      "supported",
                      path);
    else if (ff)
        st = sbp_fail(err, SBP_EINPUT, "%s: fan_in_fan_out is for GPT-2's Conv1D, not these models",
                      path);
    if (!st) {
        c->r = (int)r->valuedouble, c->alpha = alpha->valuedouble, c->use_rslora = rslora;
        if (cJSON_IsString(tm)) {
            if (!sbp_lora_targets_parse(tm->valuestring, &c->targets))
                st = sbp_fail(err, SBP_EINPUT, "%s: target_modules \"%s\"", path, tm->valuestring);
        } else if (cJSON_IsArray(tm)) {
            const cJSON *it;
            cJSON_ArrayForEach(it, tm) {
                unsigned b;
                if (!cJSON_IsString(it) || !sbp_lora_targets_parse(it->valuestring, &b)) {
                    st = sbp_fail(err, SBP_EINPUT, "%s: unknown target module %s%s%s", path,
                                  cJSON_IsString(it) ? "\"" : "",
                                  cJSON_IsString(it) ? it->valuestring : "(not a string)",
                                  cJSON_IsString(it) ? "\"" : "");
                    break;
                }
                c->targets |= b;
            }
        } else {
            st = sbp_fail(err, SBP_EINPUT, "%s: target_modules is missing", path);
        }
    }
    return st ? st : check_config(c, err) ? sbp_fail_prefix(err, "%s: ", path) : SBP_OK;
}

sbp_status sbp_lora_load(sbp_lora *a, const char *dir, const sbp_config *cfg, sbp_precision prec,
                         sbp_ledger *lg, sbp_err *err) {
    memset(a, 0, sizeof *a);
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    sbp_status st = read_config(&a->cfg, path, err);
    if (!st) st = sbp_lora_params_build(&a->params, cfg, &a->cfg, err);
    if (!st) st = alloc_slab(a, prec, lg, err);
    sbp_st_file sf = {0};
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (!st) st = sbp_st_open(&sf, path, err);
    for (int i = 0; !st && i < a->params.n; i++) {
        const sbp_param *p = &a->params.p[i];
        const sbp_st_tensor *t = sbp_st_find(&sf, p->name);
        if (!t)
            st = sbp_fail(err, SBP_EINPUT, "%s: no tensor \"%s\" (r %d, targets of the config)",
                          path, p->name, a->cfg.r);
        else if (t->ndim != 2 || t->shape[0] != p->shape[0] || t->shape[1] != p->shape[1])
            st = sbp_fail(
                err, SBP_EINPUT, "%s: \"%s\" has shape [%lld, %lld], the model needs [%lld, %lld]",
                path, p->name, (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0),
                (long long)p->shape[0], (long long)p->shape[1]);
        else
            st = sbp_st_read(&sf, t, (char *)a->w + (prec == SBP_FP64 ? 8 : 4) * p->offset,
                             prec == SBP_FP64 ? SBP_DT_F64 : SBP_DT_F32, err);
    }
    for (int i = 0; !st && i < sf.n; i++)
        if (sbp_params_find(&a->params, sf.t[i].name) < 0)
            st = sbp_fail(err, SBP_EINPUT,
                          "%s: \"%s\" is not a tensor of this adapter (model, targets or rank "
                          "differ?)",
                          path, sf.t[i].name);
    if (sf.f) sbp_st_close(&sf);
    if (!st) st = check_finite(a, path, err); /* as the model loader rejects non-finite weights */
    if (st) sbp_lora_free(a, lg);
    return st;
}

sbp_status sbp_lora_save(const char *dir, const sbp_lora *a, const char *base_model, sbp_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s: not saved", dir);
    sbp_status st = check_finite(a, path, err);
    if (!st) st = sbp_make_dirs(dir, err);
    if (st) return st;
    cJSON *j = cJSON_CreateObject(), *tm = cJSON_CreateArray();
    cJSON_AddStringToObject(j, "peft_type", "LORA");
    cJSON_AddStringToObject(j, "task_type", "CAUSAL_LM");
    cJSON_AddStringToObject(j, "base_model_name_or_path", base_model ? base_model : "");
    cJSON_AddNumberToObject(j, "r", a->cfg.r);
    cJSON_AddNumberToObject(j, "lora_alpha", a->cfg.alpha);
    cJSON_AddNumberToObject(j, "lora_dropout", 0);
    cJSON_AddBoolToObject(j, "use_rslora", a->cfg.use_rslora);
    cJSON_AddBoolToObject(j, "use_dora", 0);
    cJSON_AddStringToObject(j, "bias", "none");
    cJSON_AddBoolToObject(j, "fan_in_fan_out", 0);
    cJSON_AddBoolToObject(j, "inference_mode", 1);
    cJSON_AddBoolToObject(j, "init_lora_weights", 1);
    for (int i = 0; i < N_TARGETS; i++)
        if (a->cfg.targets & targets[i].bit)
            cJSON_AddItemToArray(tm, cJSON_CreateString(targets[i].short_name));
    cJSON_AddItemToObject(j, "target_modules", tm);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    /* weights first, each file atomically: the config never stands beside missing weights */
    sbp_st_entry *e = calloc((size_t)(a->params.n ? a->params.n : 1), sizeof *e);
    if (!e) {
        free(text);
        return sbp_fail(err, SBP_ENOMEM, "out of memory");
    }
    const size_t esz = a->prec == SBP_FP64 ? 8 : 4;
    for (int i = 0; i < a->params.n; i++) {
        const sbp_param *p = &a->params.p[i];
        e[i] = (sbp_st_entry){.name = p->name,
                              .dtype = a->prec == SBP_FP64 ? SBP_DT_F64 : SBP_DT_F32,
                              .ndim = 2,
                              .shape = {p->shape[0], p->shape[1]},
                              .data = (const char *)a->w + esz * p->offset};
    }
    static const char *const meta[] = {"format", "pt", NULL};
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    st = sbp_st_write(path, e, a->params.n, meta, err);
    free(e);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (!st) st = sbp_write_atomic(path, text, strlen(text), err);
    free(text);
    return st;
}
