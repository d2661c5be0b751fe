/* data.c — where a training run's micro-batches come from, and in which order.
 *
 * Two sources:
 *  - batch files (the formats of docs/training.md#objectives), one file a micro-batch. A directory
 *    contributes its *.safetensors files in name order; files named directly keep the order they
 *    were given in, so a user can fix any order.
 *  - a JSONL file of token-id records, {"input_ids": [...], "labels": [...]} (labels optional:
 *    then labels = input_ids, HF's causal-LM convention, shifted inside the loss), B records a
 *    micro-batch, one record a row of exactly T tokens: a longer record is truncated to its
 *    first T tokens (TRL truncates to max_length), a shorter one is padded on the right with id
 *    0, attention_mask 0 and label -100.
 *    Records are padded, not packed. Packing several documents into one row would let each
 *    document attend to the ones before it: this model has one causal mask and positions
 *    0..T-1 per row, so it cannot reset positions or block attention at a document boundary,
 *    and the loss of a packed row would not be the loss of its documents. Padding keeps every
 *    record's loss exactly what HF computes for it alone, and a fixed T keeps every batch on the
 *    same chunk grid, which the schedules' bitwise agreement needs.
 *    A record with no target inside its first T tokens adds nothing to any loss and is skipped
 *    (counted in sbp_data_skipped).
 *
 * Everything is read and checked when the source is opened (ids and labels against the
 * vocabulary, every batch against the objective), so a run never stops half-way on bad data. */
#include "../core/err.h"
#include "../core/objective.h"
#include "../core/rng.h"
#include "../io/file.h"
#include "../io/json.h"
#include "data.h"
#include "../streambp.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct sbp_data {
    sbp_data_opts o;
    sbp_config cfg;
    uint64_t hash;
    /* batch files */
    char **files; /* (n_files) */
    int64_t n_files;
    /* jsonl records: record r is ids/labels[start[r], start[r] + len[r]), already cut to T */
    int32_t *ids, *labels;
    int64_t *start;
    int *len, *line;
    int64_t n_records, truncated, skipped;
    char jsonl_path[4096];
    char name[4200]; /* sbp_data_item_name's answer */
};

/* ---- batch files ----------------------------------------------------------------------------- */

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static sbp_status add_file(sbp_data *d, const char *path, sbp_err *err) {
    char **f = realloc(d->files, sizeof *f * (size_t)(d->n_files + 1));
    if (!f) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    d->files = f;
    if (!(f[d->n_files] = strdup(path))) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    d->n_files++;
    return SBP_OK;
}

static sbp_status add_dir(sbp_data *d, const char *dir, sbp_err *err) {
    DIR *dp = opendir(dir);
    if (!dp)
        return sbp_fail(err, SBP_EIO, "%s: cannot read the directory: %s", dir, strerror(errno));
    int64_t first = d->n_files;
    sbp_status st = SBP_OK;
    struct dirent *e;
    while (!st && (e = readdir(dp))) {
        if (!ends_with(e->d_name, ".safetensors")) continue;
        char path[4200];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) st = add_file(d, path, err);
    }
    closedir(dp);
    if (st) return st;
    if (d->n_files == first)
        return sbp_fail(err, SBP_EINPUT, "%s: the directory holds no *.safetensors batch file",
                        dir);
    qsort(d->files + first, (size_t)(d->n_files - first), sizeof *d->files, cmp_str);
    return SBP_OK;
}

static sbp_status hash_file(uint64_t *h, const char *path, sbp_err *err) {
    FILE *f;
    uint64_t size;
    sbp_status st = sbp_open_regular(&f, &size, path, err);
    if (st) return st;
    char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) *h = sbp_hash64(buf, got, *h);
    int bad = ferror(f);
    fclose(f);
    return bad ? sbp_fail(err, SBP_EIO, "%s: read error", path) : SBP_OK;
}

/* The objective's own checks on one batch, as if it were a step of its own; a reference model
 * that will supply reference log-probs is stood in for by zeros. */
static sbp_status check_objective(sbp_batch *b, const sbp_data_opts *o, sbp_err *err) {
    sbp_objective obj = o->objective;
    obj.num_items = 0, obj.num_sequences = 0;
    double *stand_in = NULL;
    if (o->reference_model) {
        size_t cells = obj.kind == SBP_OBJ_DPO ? (size_t)b->B : (size_t)b->B * b->T;
        if (!(stand_in = calloc(cells, sizeof *stand_in)))
            return sbp_fail(err, SBP_ENOMEM, "out of memory");
        if (obj.kind == SBP_OBJ_DPO && !b->ref_seq_logps)
            b->ref_seq_logps = stand_in;
        else if (obj.kind == SBP_OBJ_GRPO && !b->ref_logps)
            b->ref_logps = stand_in;
    }
    sbp_obj_eval ev;
    sbp_status st = sbp_obj_begin(&ev, &obj, b, err);
    if (!st) sbp_obj_end(&ev);
    if (b->ref_seq_logps == stand_in) b->ref_seq_logps = NULL;
    if (b->ref_logps == stand_in) b->ref_logps = NULL;
    free(stand_in);
    return st;
}

static sbp_status open_files(sbp_data *d, sbp_err *err) {
    sbp_status st = SBP_OK;
    for (int i = 0; i < d->o.n_paths && !st; i++) {
        const char *p = d->o.paths[i];
        struct stat sb;
        if (stat(p, &sb) != 0)
            st = sbp_fail(err, SBP_EIO, "%s: no such batch file or directory", p);
        else if (S_ISDIR(sb.st_mode))
            st = add_dir(d, p, err);
        else
            st = add_file(d, p, err);
    }
    for (int64_t i = 0; i < d->n_files && !st; i++) {
        sbp_batch b;
        st = sbp_batch_load_as(&b, d->files[i], &d->cfg, d->o.objective.kind, d->o.scale_rewards,
                               err);
        if (st) break;
        if ((st = check_objective(&b, &d->o, err))) sbp_fail_prefix(err, "%s: ", d->files[i]);
        sbp_batch_free(&b);
        if (!st) st = hash_file(&d->hash, d->files[i], err);
    }
    return st;
}

/* ---- JSONL records --------------------------------------------------------------------------- */

/* Appends the ints of arr (n of them, at most T kept) to v; checks each with ok(). */
static sbp_status read_ints(int32_t **v, int64_t *len, int64_t *cap, const cJSON *arr, int T, int V,
                            int labels, const char *where, sbp_err *err) {
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) {
        const char *what = labels ? "labels" : "input_ids";
        int64_t val;
        /* the widest range first, so an id is compared, never converted, while out of range */
        if (!sbp_json_int(x, INT32_MIN, INT32_MAX, &val)) {
            if (cJSON_IsNumber(x) && x->valuedouble == floor(x->valuedouble))
                return sbp_fail(err, SBP_EINPUT, "%s: %s[%d] = %.0f is outside [0, %d)%s", where,
                                what, i, x->valuedouble, V, labels ? " and is not -100" : "");
            return sbp_fail(err, SBP_EINPUT, "%s: %s[%d] is not an integer", where, what, i);
        }
        int ok = (val >= 0 && val < V) || (labels && val == SBP_IGNORE);
        if (!ok)
            return sbp_fail(err, SBP_EINPUT, "%s: %s[%d] = %lld is outside [0, %d)%s", where, what,
                            i, (long long)val, V, labels ? " and is not -100" : "");
        if (i < T) {
            if (*len == *cap) {
                int64_t nc = *cap ? 2 * *cap : 4096;
                int32_t *nv = realloc(*v, sizeof *nv * (size_t)nc);
                if (!nv) return sbp_fail(err, SBP_ENOMEM, "out of memory reading records");
                *v = nv, *cap = nc;
            }
            (*v)[(*len)++] = (int32_t)val;
        }
        i++;
    }
    return SBP_OK;
}

static sbp_status add_record(sbp_data *d, const char *text, int lineno, int64_t *cap_tok,
                             int64_t *cap_lab, int64_t *cap_rec, int64_t *n_tok, int64_t *n_lab,
                             sbp_err *err) {
    char where[4200];
    snprintf(where, sizeof where, "%s:%d", d->o.jsonl, lineno);
    cJSON *root = NULL;
    sbp_status st = sbp_json_parse(&root, text, strlen(text), where, err);
    if (st) return st;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return sbp_fail(err, SBP_EFORMAT, "%s: not a JSON object", where);
    }
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "input_ids");
    const cJSON *labels = cJSON_GetObjectItemCaseSensitive(root, "labels");
    st = SBP_OK;
    int n = cJSON_GetArraySize(ids);
    if (!cJSON_IsArray(ids) || n == 0)
        st = sbp_fail(err, SBP_EINPUT, "%s: no \"input_ids\" list of token ids", where);
    else if (labels && !cJSON_IsNull(labels) &&
             (!cJSON_IsArray(labels) || cJSON_GetArraySize(labels) != n))
        st = sbp_fail(err, SBP_EINPUT, "%s: \"labels\" must be a list as long as input_ids (%d)",
                      where, n);
    if (labels && cJSON_IsNull(labels)) labels = NULL;
    int64_t t0 = *n_tok;
    if (!st) st = read_ints(&d->ids, n_tok, cap_tok, ids, d->o.T, d->cfg.vocab, 0, where, err);
    if (!st)
        st = read_ints(&d->labels, n_lab, cap_lab, labels ? labels : ids, d->o.T, d->cfg.vocab, 1,
                       where, err);
    cJSON_Delete(root);
    if (st) return st;
    int kept = (int)(*n_tok - t0), targets = 0;
    for (int t = 1; t < kept; t++) targets += d->labels[t0 + t] != SBP_IGNORE;
    if (targets == 0) { /* nothing to learn from in the first T tokens */
        *n_tok = *n_lab = t0;
        d->skipped++;
        return SBP_OK;
    }
    d->truncated += n > d->o.T;
    if (d->n_records == *cap_rec) {
        int64_t nc = *cap_rec ? 2 * *cap_rec : 256;
        int64_t *ns = realloc(d->start, sizeof *ns * (size_t)nc);
        if (ns) d->start = ns;
        int *nl = ns ? realloc(d->len, sizeof *nl * (size_t)nc) : NULL;
        if (nl) d->len = nl;
        int *nn = nl ? realloc(d->line, sizeof *nn * (size_t)nc) : NULL;
        if (!nn) return sbp_fail(err, SBP_ENOMEM, "out of memory reading records");
        d->line = nn, *cap_rec = nc;
    }
    d->start[d->n_records] = t0;
    d->len[d->n_records] = kept;
    d->line[d->n_records] = lineno;
    d->n_records++;
    return SBP_OK;
}

/* Reads one line (its '\n' kept) into *buf, growing it up to max bytes: 1 with *len set, 0 at the
 * end of the file, -1 on a read error, -2 when the line is longer than max (nothing past max is
 * held, so a file of one endless line cannot take memory without bound). */
static int read_line(FILE *f, char **buf, size_t *cap, size_t *len, size_t max) {
    size_t n = 0;
    int c;
    while ((c = getc_unlocked(f)) != EOF) {
        if (n == max) return -2;
        if (n + 2 > *cap) {
            size_t nc = *cap ? 2 * *cap : 4096;
            if (nc > max + 2) nc = max + 2;
            char *nb = realloc(*buf, nc);
            if (!nb) return -3;
            *buf = nb, *cap = nc;
        }
        (*buf)[n++] = (char)c;
        if (c == '\n') break;
    }
    if (ferror(f)) return -1;
    if (n == 0) return 0;
    (*buf)[n] = 0;
    *len = n;
    return 1;
}

/* The records of the JSONL text in f; name is its path in messages. */
static sbp_status read_jsonl(sbp_data *d, FILE *f, const char *name, sbp_err *err) {
    char *line = NULL;
    size_t cap = 0, got = 0;
    int lineno = 0, r;
    int64_t cap_tok = 0, cap_lab = 0, cap_rec = 0, n_tok = 0, n_lab = 0;
    sbp_status st = SBP_OK;
    while (!st && (r = read_line(f, &line, &cap, &got, SBP_JSONL_MAX_LINE)) > 0) {
        if (lineno == INT32_MAX) {
            st = sbp_fail(err, SBP_EFORMAT, "%s: more than %d lines", name, INT32_MAX);
            break;
        }
        lineno++;
        d->hash = sbp_hash64(line, got, d->hash);
        if (strlen(line) != got) {
            st = sbp_fail(err, SBP_EFORMAT, "%s:%d: a NUL byte inside the line", name, lineno);
            break;
        }
        const char *p = line;
        while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
        if (!*p) continue; /* blank line */
        st = add_record(d, line, lineno, &cap_tok, &cap_lab, &cap_rec, &n_tok, &n_lab, err);
    }
    if (!st && r == -2)
        st = sbp_fail(err, SBP_EFORMAT, "%s:%d: the line is longer than %d bytes (the limit)", name,
                      lineno + 1, SBP_JSONL_MAX_LINE);
    else if (!st && r == -3)
        st = sbp_fail(err, SBP_ENOMEM, "%s:%d: out of memory reading the line", name, lineno + 1);
    else if (!st && r == -1)
        st = sbp_fail(err, SBP_EIO, "%s: read error", name);
    free(line);
    if (!st && d->n_records == 0)
        st = sbp_fail(err, SBP_EINPUT,
                      "%s: no record with a target token in its first %d tokens (%lld skipped)",
                      name, d->o.T, (long long)d->skipped);
    return st;
}

static sbp_status check_jsonl_opts(const sbp_data_opts *o, sbp_err *err) {
    if (o->T < 1 || o->B < 1)
        return sbp_fail(err, SBP_EUSAGE, "JSONL data needs T >= 1 and B >= 1 (got %d, %d)", o->T,
                        o->B);
    if (o->objective.kind != SBP_OBJ_SFT)
        return sbp_fail(err, SBP_EUSAGE,
                        "JSONL records are SFT data; DPO and GRPO train from batch files");
    return SBP_OK;
}

static sbp_status open_jsonl(sbp_data *d, sbp_err *err) {
    sbp_status st = check_jsonl_opts(&d->o, err);
    if (st) return st;
    FILE *f;
    uint64_t size;
    /* a regular file only: a FIFO would block the open or the read, a device never end */
    if ((st = sbp_open_regular(&f, &size, d->o.jsonl, err))) return st;
    st = read_jsonl(d, f, d->o.jsonl, err);
    fclose(f);
    return st;
}

sbp_status sbp_data_jsonl_bytes(sbp_data **out, const char *bytes, size_t n, const sbp_data_opts *o,
                                const sbp_config *cfg, sbp_err *err) {
    *out = NULL;
    sbp_status st = check_jsonl_opts(o, err);
    if (st) return st;
    sbp_data *d = calloc(1, sizeof *d);
    if (!d) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    d->o = *o, d->cfg = *cfg;
    snprintf(d->jsonl_path, sizeof d->jsonl_path, "%s", o->jsonl ? o->jsonl : "<bytes>");
    d->o.jsonl = d->jsonl_path;
    d->o.paths = NULL, d->o.n_paths = 0;
    static const char empty[1] = "";
    FILE *f = fmemopen((void *)(n ? bytes : empty), n ? n : 1, "rb");
    if (!f) st = sbp_fail(err, SBP_ENOMEM, "out of memory");
    if (!st && !n) getc(f); /* fmemopen refuses a size of 0: read past the 1-byte stand-in */
    if (!st) st = read_jsonl(d, f, d->jsonl_path, err);
    if (f) fclose(f);
    if (st) {
        sbp_data_free(d);
        return st;
    }
    *out = d;
    return SBP_OK;
}

/* ---- the source ------------------------------------------------------------------------------ */

sbp_status sbp_data_open(sbp_data **out, const sbp_data_opts *o, const sbp_config *cfg,
                         sbp_err *err) {
    *out = NULL;
    if (!!o->jsonl == !!o->n_paths)
        return sbp_fail(err, SBP_EUSAGE, "give either batch files or a JSONL file as data");
    sbp_data *d = calloc(1, sizeof *d);
    if (!d) return sbp_fail(err, SBP_ENOMEM, "out of memory");
    d->o = *o;
    d->cfg = *cfg;
    sbp_status st;
    if (o->jsonl) { /* the path is kept (item names); the caller's strings need not outlive us */
        snprintf(d->jsonl_path, sizeof d->jsonl_path, "%s", o->jsonl);
        d->o.jsonl = d->jsonl_path;
        st = open_jsonl(d, err);
    } else {
        st = open_files(d, err); /* copies every path it finds */
    }
    d->o.paths = NULL, d->o.n_paths = 0;
    if (st) {
        sbp_data_free(d);
        return st;
    }
    *out = d;
    return SBP_OK;
}

void sbp_data_free(sbp_data *d) {
    if (!d) return;
    for (int64_t i = 0; i < d->n_files; i++) free(d->files[i]);
    free(d->files);
    free(d->ids), free(d->labels), free(d->start), free(d->len), free(d->line);
    free(d);
}

int64_t sbp_data_items(const sbp_data *d) {
    return d->o.jsonl ? d->n_records : d->n_files;
}

int sbp_data_items_per_batch(const sbp_data *d) {
    return d->o.jsonl ? d->o.B : 1;
}

uint64_t sbp_data_hash(const sbp_data *d) {
    return d->hash;
}

int64_t sbp_data_truncated(const sbp_data *d) {
    return d->truncated;
}

int64_t sbp_data_skipped(const sbp_data *d) {
    return d->skipped;
}

const char *sbp_data_item_name(sbp_data *d, int64_t i) {
    if (i < 0 || i >= sbp_data_items(d)) return "?";
    if (!d->o.jsonl) return d->files[i];
    snprintf(d->name, sizeof d->name, "%s:%d", d->o.jsonl, d->line[i]);
    return d->name;
}

sbp_status sbp_data_batch(sbp_batch *b, const sbp_data *d, const int64_t *items, int n,
                          sbp_err *err) {
    memset(b, 0, sizeof *b);
    if (n < 1 || n > sbp_data_items_per_batch(d))
        return sbp_fail(err, SBP_EUSAGE, "a micro-batch takes 1 to %d items (got %d)",
                        sbp_data_items_per_batch(d), n);
    for (int i = 0; i < n; i++)
        if (items[i] < 0 || items[i] >= sbp_data_items(d))
            return sbp_fail(err, SBP_EUSAGE, "item %lld does not exist", (long long)items[i]);
    if (!d->o.jsonl)
        return sbp_batch_load_as(b, d->files[items[0]], &d->cfg, d->o.objective.kind,
                                 d->o.scale_rewards, err);
    const int T = d->o.T;
    const size_t cells = (size_t)n * T;
    b->B = n, b->T = T, b->kind = SBP_OBJ_SFT;
    b->ids = calloc(cells, sizeof *b->ids);
    b->labels = malloc(cells * sizeof *b->labels);
    b->mask = calloc(cells, 1);
    if (!b->ids || !b->labels || !b->mask) {
        sbp_batch_free(b);
        return sbp_fail(err, SBP_ENOMEM, "out of memory for a batch of %d x %d", n, T);
    }
    for (int r = 0; r < n; r++) {
        const int64_t s = d->start[items[r]];
        const int len = d->len[items[r]];
        for (int t = 0; t < T; t++) {
            size_t at = (size_t)r * T + t;
            b->ids[at] = t < len ? d->ids[s + t] : 0;
            b->labels[at] = t < len ? d->labels[s + t] : SBP_IGNORE;
            b->mask[at] = t < len;
        }
    }
    sbp_batch_count_targets(b);
    return SBP_OK;
}

/* ---- the order ------------------------------------------------------------------------------- */

/* The order of the epoch that starts with generator state s->rng. */
static void make_order(sbp_sampler *s) {
    for (int64_t i = 0; i < s->n; i++) s->order[i] = i;
    if (!s->shuffle) return;
    sbp_rng r;
    memcpy(r.s, s->rng, sizeof r.s);
    for (int64_t i = s->n - 1; i > 0; i--) { /* Fisher-Yates */
        int64_t j = (int64_t)(sbp_rng_next(&r) % (uint64_t)(i + 1));
        int64_t t = s->order[i];
        s->order[i] = s->order[j], s->order[j] = t;
    }
}

/* The generator's state after the permutation of the current epoch was drawn. */
static void advance_epoch(sbp_sampler *s) {
    if (!s->shuffle) return;
    sbp_rng r;
    memcpy(r.s, s->rng, sizeof r.s);
    for (int64_t i = s->n - 1; i > 0; i--) sbp_rng_next(&r);
    memcpy(s->rng, r.s, sizeof r.s);
}

sbp_status sbp_sampler_init(sbp_sampler *s, int64_t n, int per_batch, int shuffle, uint64_t seed,
                            sbp_err *err) {
    memset(s, 0, sizeof *s);
    if (n < 1 || per_batch < 1)
        return sbp_fail(err, SBP_EUSAGE, "a sampler needs items (%lld) and a batch size (%d)",
                        (long long)n, per_batch);
    s->n = n, s->per_batch = per_batch, s->shuffle = shuffle, s->seed = seed;
    if (!(s->order = malloc(sizeof *s->order * (size_t)n)))
        return sbp_fail(err, SBP_ENOMEM, "out of memory");
    sbp_rng r;
    sbp_rng_seed(&r, seed);
    memcpy(s->rng, r.s, sizeof r.s);
    make_order(s);
    return SBP_OK;
}

sbp_status sbp_sampler_restore(sbp_sampler *s, int64_t epoch, int64_t pos, const uint64_t rng[4],
                               sbp_err *err) {
    if (epoch < 0 || pos < 0 || pos > s->n)
        return sbp_fail(err, SBP_EINPUT,
                        "data position epoch %lld, item %lld is outside an epoch of %lld items",
                        (long long)epoch, (long long)pos, (long long)s->n);
    s->epoch = epoch, s->pos = pos;
    memcpy(s->rng, rng, sizeof s->rng);
    make_order(s);
    return SBP_OK;
}

int sbp_sampler_next(sbp_sampler *s, int64_t *items) {
    if (s->pos == s->n) { /* the next epoch, with the next permutation */
        advance_epoch(s);
        s->epoch++, s->pos = 0;
        make_order(s);
    }
    int k = 0;
    while (k < s->per_batch && s->pos < s->n) items[k++] = s->order[s->pos++];
    return k;
}

void sbp_sampler_free(sbp_sampler *s) {
    free(s->order);
    memset(s, 0, sizeof *s);
}
