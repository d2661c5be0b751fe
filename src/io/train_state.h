/* train_state.h — a checkpoint's trainer_state.json, read. Internal.
 *
 * A pure function of the text: every number is range-checked before it becomes an integer (a
 * huge, negative or fractional one is an error naming the field, never a wrapped value), every
 * string has the form its field needs, and file names cannot leave the checkpoint. */
#ifndef SBP_TRAIN_STATE_H
#define SBP_TRAIN_STATE_H

#include "../streambp.h"

#include <cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* Largest step, token count, epoch or item a state may hold: every integer up to it is a
 * double exactly, so what was written is what is read. */
#define SBP_STATE_INT_MAX ((int64_t)1 << 53)

typedef struct {
    int64_t step, tokens, epoch, item;
    uint64_t rng[4];       /* data_position.rng_at_epoch_start */
    cJSON *root;           /* owns the tree the two below point into */
    const cJSON *settings; /* object: setting -> string */
    const cJSON *files;    /* object: file name -> 64 lowercase hex digits; NULL when absent
                              (states written before checkpoints recorded hashes) */
} sbp_train_state;

/* Parses n bytes of trainer_state.json; `what` names it in messages (a path). On failure s
 * holds nothing to free. */
sbp_status sbp_train_state_parse(sbp_train_state *s, const char *text, size_t n, const char *what,
                                 sbp_err *err);
void sbp_train_state_free(sbp_train_state *s);

#endif
