/* fuzz_safetensors.c — libFuzzer target: a safetensors file (header and data), read with
 * sbp_st_open and, when it opens, every tensor read back converted as the loaders do. */
#include "fuzz.h"
#include "../../src/io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    char path[64];
    int fd = fuzz_file(path, data, n);
    if (fd < 0) return 0;
    sbp_st_file sf;
    sbp_err err = {0};
    if (sbp_st_open(&sf, path, &err) == SBP_OK) {
        for (int i = 0; i < sf.n; i++) {
            const sbp_st_tensor *t = &sf.t[i];
            if (t->numel > (1 << 20)) continue; /* the header promises it, the file holds it */
            void *buf = malloc(8 * (size_t)(t->numel ? t->numel : 1));
            if (!buf) continue;
            sbp_st_read(&sf, t, buf, sbp_dtype_is_float(t->dtype) ? SBP_DT_F64 : SBP_DT_I64, &err);
            free(buf);
        }
        for (int i = 0; i < sf.n_meta; i++) (void)sbp_st_meta(&sf, sf.meta_key[i]);
        sbp_st_close(&sf);
    }
    close(fd);
    return 0;
}
