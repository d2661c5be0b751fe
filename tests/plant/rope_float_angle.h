/* rope_float_angle.h — a planted float32 slip for tests/test_plant.c, force-included (-include)
 * into the float32 copy of src/kernels/rope.c only: the RoPE angle t·inv_freq is rounded to
 * float before its cosine and sine, as code that forms the angle in float does. At positions in
 * the tens of thousands the angle is off by ~1e-3 rad; float32 full BP shares the slip, so a
 * budget measured from it cannot see it. Never part of a normal build. */
#include <math.h>
#define cos(x) cosf((float)(x))
#define sin(x) sinf((float)(x))
