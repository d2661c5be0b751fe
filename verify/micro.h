/* micro.h — a batch cut into micro-batches, for the verifier's gradient-accumulation group.
 *
 * The rows are split into up to three micro-batches in order (DPO: the pairs, each micro-batch
 * holding its pairs' chosen and rejected rows). The first keeps the batch's T; each later one is
 * cut after its last target, so the micro-batches of a step have different T where the batch
 * has padding or prompt-only tails. Cutting there changes nothing that is computed (no target is
 * predicted from the columns removed, and by causality they influence no earlier position), and
 * the step's longest T stays the batch's T (dr_grpo's default normaliser). A step over them must
 * give the gradient of the whole batch (ref/SEMANTICS.md, "Gradient accumulation"). */
#ifndef SBP_VERIFY_MICRO_H
#define SBP_VERIFY_MICRO_H

#include "../src/streambp.h"

enum { SBP_VERIFY_MAX_MICRO = 3 };

/* Fills mb[0..*n) (at most SBP_VERIFY_MAX_MICRO); *n = 0 when the batch has one row (one pair).
 * Free each with sbp_batch_free. */
sbp_status sbp_verify_split(sbp_batch *mb, int *n, const sbp_batch *b, sbp_err *err);

#endif
