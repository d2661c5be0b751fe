/* load.h — the library's reading of the inputs against the oracle's.
 *
 * The library (src/io) and the oracle (ref/io.c) read config.json, the weights and the batch
 * file each with their own code, and each derives what it needs from the raw contents: targets
 * and their shift, masks, DPO's padded rows, GRPO's labels, advantages and per-token shifts,
 * the config's defaults. The gradient groups of the verifier show where a difference matters;
 * this comparison says what it is: the config field, the tensor whose shape or weights differ,
 * the batch tensor and the row where the two readings part. */
#ifndef SBP_VERIFY_LOAD_H
#define SBP_VERIFY_LOAD_H

#include "../ref/ref.h"
#include "matrix.h"

/* Compares the library's model m and batch b (after any reference model) with the oracle's rm and
 * rb. Each parameter tensor of m's table is a row of g, failed when the oracle's table lacks it,
 * gives it another shape, or holds other weights; tensors only the oracle has, config fields and
 * batch contents that differ are described in notes. Returns the number of disagreements. */
int sbp_verify_compare_inputs(sbp_verify_group *g, char *notes, size_t n_notes, const sbp_model *m,
                              const sbp_batch *b, const ref_model *rm, const sbp_batch *rb);

#endif
