/* ref32.c — the oracle's loops in float32 (ref.h): ref.c compiled with REF_F32. */
#define REF_F32 1
#include "ref.c"
