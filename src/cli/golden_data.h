/* golden_data.h — the committed golden cases built into the binary (golden_embed.sh writes the
 * table at build time from data/golden/, the model configs they name and the tiny batches). */
#ifndef SBP_GOLDEN_DATA_H
#define SBP_GOLDEN_DATA_H

#include <stddef.h>

typedef struct {
    const char *path; /* as in the repository: "data/golden/qwen3-tiny-sft-fp32.txt" */
    const unsigned char *data;
    size_t size;
} golden_file;

extern const golden_file golden_files[];
extern const int golden_n_files;

#endif
