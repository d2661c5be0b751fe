/* digest.c — SHA-256 fingerprints of gradient files (OpenSSL's libcrypto does the hashing). */
#include "digest.h"
#include "../src/core/err.h"
#include "../src/io/safetensors.h"
#include "text.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int sha256_hex(char out[65], const void *data, size_t n) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (!EVP_Digest(data, n, md, &len, EVP_sha256(), NULL) || len != 32) return 0;
    for (unsigned i = 0; i < len; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
    return 1;
}

sbp_status sbp_digest_file(sbp_file_digest *d, const char *path, sbp_err *err) {
    memset(d, 0, sizeof *d);
    sbp_st_file sf;
    sbp_status st = sbp_st_open(&sf, path, err);
    if (st) return st;
    const char *loss = sbp_st_meta(&sf, "loss");
    if (loss) snprintf(d->loss, sizeof d->loss, "%a", strtod(loss, NULL));
    d->t = calloc((size_t)(sf.n ? sf.n : 1), sizeof *d->t);
    if (!d->t) st = sbp_fail(err, SBP_ENOMEM, "out of memory");
    for (int i = 0; !st && i < sf.n; i++) {
        const sbp_st_tensor *t = &sf.t[i];
        const size_t n = (size_t)(t->end - t->begin);
        void *buf = malloc(n ? n : 1);
        if (!buf) {
            st = sbp_fail(err, SBP_ENOMEM, "out of memory reading \"%s\"", t->name);
            break;
        }
        sbp_tensor_digest *o = &d->t[d->n++];
        snprintf(o->name, sizeof o->name, "%s", t->name);
        snprintf(o->dtype, sizeof o->dtype, "%s", sbp_dtype_name(t->dtype));
        if (!(st = sbp_st_read_raw(&sf, t, buf, err)) && !sha256_hex(o->sha256, buf, n))
            st = sbp_fail(err, SBP_EIO, "SHA-256 of \"%s\" failed", t->name);
        free(buf);
    }
    sbp_st_close(&sf);
    if (st) sbp_file_digest_free(d);
    return st;
}

void sbp_file_digest_free(sbp_file_digest *d) {
    free(d->t);
    memset(d, 0, sizeof *d);
}

void sbp_digest_print(FILE *f, const sbp_file_digest *d) {
    fprintf(f, "loss %s\n", d->loss[0] ? d->loss : "-");
    for (int i = 0; i < d->n; i++)
        fprintf(f, "%s %s %s\n", d->t[i].name, d->t[i].dtype, d->t[i].sha256);
}

char *sbp_digest_text(const sbp_file_digest *d) {
    size_t cap = 64 + (size_t)d->n * (SBP_TEXT_ESCAPED + 96), len = 0;
    char *s = malloc(cap), name[SBP_TEXT_ESCAPED];
    if (!s) return NULL;
    len += (size_t)snprintf(s + len, cap - len, "loss %s\n", d->loss[0] ? d->loss : "-");
    for (int i = 0; i < d->n && len < cap; i++)
        len += (size_t)snprintf(s + len, cap - len, "%s %s %s\n",
                                sbp_text_escape(name, sizeof name, d->t[i].name), d->t[i].dtype,
                                d->t[i].sha256);
    return s;
}

void sbp_digest_first_difference(char *out, size_t n, const char *got, const char *want) {
    out[0] = '\0';
    for (int line = 1; *got || *want; line++) {
        size_t gl = strcspn(got, "\n"), wl = strcspn(want, "\n");
#ifdef SBP_PLANT_GOLDEN_LINE_PREFIX /* planted (tests/test_selftest.c): 8 bytes of each line */
        if (gl != wl || memcmp(got, want, gl < 8 ? gl : 8) != 0) {
#else
        if (gl != wl || memcmp(got, want, gl) != 0) {
#endif
            snprintf(out, n, "line %d (%.*s)", line, (int)strcspn(want, " \n"),
                     *want ? want : "end of the golden file");
            return;
        }
        got += gl + (got[gl] == '\n'), want += wl + (want[wl] == '\n');
    }
}
