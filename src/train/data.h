/* data.h — the training data source's internals that tests and fuzz targets reach. Internal. */
#ifndef SBP_DATA_H
#define SBP_DATA_H

#include "../streambp.h"

#include <stddef.h>

/* The longest JSONL line read, in bytes with its newline: a record is cut to T tokens, but the
 * whole line is parsed, so without a limit one endless line would take memory without bound.
 * 64 MiB holds well over a million tokens with labels. */
#define SBP_JSONL_MAX_LINE (64 << 20)

/* sbp_data_open's JSONL reader on n bytes in memory (o->jsonl, if set, names them in messages):
 * the records and every check exactly as from a file. */
sbp_status sbp_data_jsonl_bytes(sbp_data **out, const char *bytes, size_t n, const sbp_data_opts *o,
                                const sbp_config *cfg, sbp_err *err);

#endif
