/* objectives32.c — SFT, DPO and GRPO on the float32 loops (ref.h): objectives.c with REF_F32. */
#define REF_F32 1
#include "objectives.c"
