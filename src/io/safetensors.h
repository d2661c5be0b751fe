/* safetensors.h — reading and writing the safetensors format (huggingface/safetensors).
 *
 * Layout: u64 little-endian N, N bytes of JSON header, then the data buffer. The header maps each
 * tensor name to {dtype, shape, data_offsets [begin, end)} relative to the buffer, plus an
 * optional "__metadata__" string map. The reader validates everything the format promises: the
 * header length, the JSON, known dtypes, sizes that match the shapes, offsets inside the buffer
 * that tile it exactly (no overlap, no hole, no trailing bytes) and unique names. Internal. */
#ifndef SBP_SAFETENSORS_H
#define SBP_SAFETENSORS_H

#include "../streambp.h"
#include "file.h"

#include <stdint.h>
#include <stdio.h>

typedef enum {
    SBP_DT_BOOL,
    SBP_DT_U8,
    SBP_DT_I8,
    SBP_DT_I16,
    SBP_DT_U16,
    SBP_DT_F16,
    SBP_DT_BF16,
    SBP_DT_I32,
    SBP_DT_U32,
    SBP_DT_F32,
    SBP_DT_F64,
    SBP_DT_I64,
    SBP_DT_U64,
    SBP_DT_F8_E5M2,
    SBP_DT_F8_E4M3,
    SBP_DT_COUNT
} sbp_dtype;

const char *sbp_dtype_name(sbp_dtype d);
size_t sbp_dtype_size(sbp_dtype d);
int sbp_dtype_is_float(sbp_dtype d); /* F64, F32, F16, BF16 (the float types we convert) */

#define SBP_ST_MAX_DIMS 8

typedef struct {
    char *name;
    sbp_dtype dtype;
    int ndim;
    int64_t shape[SBP_ST_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end; /* bytes, relative to the data buffer */
} sbp_st_tensor;

typedef struct {
    char path[4096];
    FILE *f;
    uint64_t data_start; /* file offset of the data buffer */
    uint64_t data_size;
    sbp_st_tensor *t; /* (n), in header order */
    int n;
    char **meta_key, **meta_val; /* (n_meta) */
    int n_meta;
} sbp_st_file;

sbp_status sbp_st_open(sbp_st_file *sf, const char *path, sbp_err *err);
void sbp_st_close(sbp_st_file *sf);
const sbp_st_tensor *sbp_st_find(const sbp_st_file *sf, const char *name);
const char *sbp_st_meta(const sbp_st_file *sf, const char *key); /* NULL if absent */

/* Reads one tensor converted to dst_type: F32 or F64 from any float dtype, I64 from any integer
 * dtype (F64 values beyond float's range become ±Inf in F32; callers check finiteness). */
sbp_status sbp_st_read(const sbp_st_file *sf, const sbp_st_tensor *t, void *dst, sbp_dtype dst_type,
                       sbp_err *err);

/* Raw bytes of one tensor (t->end - t->begin of them) into dst, no conversion or checks. */
sbp_status sbp_st_read_raw(const sbp_st_file *sf, const sbp_st_tensor *t, void *dst, sbp_err *err);

typedef struct {
    const char *name;
    sbp_dtype dtype;
    int ndim;
    int64_t shape[SBP_ST_MAX_DIMS];
    const void *data; /* numel * sbp_dtype_size(dtype) bytes, little-endian */
} sbp_st_entry;

/* Writes the entries in the order given, with metadata from the NULL-terminated key/value array
 * meta (may be NULL). Atomic: nothing appears under path unless the whole file was written. */
sbp_status sbp_st_write(const char *path, const sbp_st_entry *e, int n, const char *const *meta,
                        sbp_err *err);
/* The same file written tensor by tensor (a tensor at a time gathered from several processes):
 * the header of the entries (their data unused) into o, opened with sbp_outfile_open; the
 * caller then writes each entry's bytes in order and commits (or aborts) o. */
sbp_status sbp_st_write_header(sbp_outfile *o, const sbp_st_entry *e, int n,
                               const char *const *meta, const char *path, sbp_err *err);
/* That header's JSON text (malloc'd; NULL when out of memory) and in *padded its length padded
 * with spaces so that the data, after the 8 bytes of the length and the text, starts 8-aligned;
 * the entries' data offsets run in their order from 0, each entry's bytes after the last's. */
char *sbp_st_header(size_t *padded, const sbp_st_entry *e, int n, const char *const *meta);

/* float16 / bfloat16 conversions (exact for all finite values; round-to-nearest-even on the way
 * down). */
float sbp_f16_to_f32(uint16_t h);
float sbp_bf16_to_f32(uint16_t h);
uint16_t sbp_f32_to_bf16(float f);
uint16_t sbp_f32_to_f16(float f);

#endif
