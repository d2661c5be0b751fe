/* registry.cc — the CUDA op tables this build has, by device and precision, for the API layer
 * (src/api/grad.c). The emulator's are built unless the build leaves them out (SBP_HAVE_EMU=0:
 * the portable builds, which run the CPU only; g++ is enough for them); the GPU's when nvcc was
 * found (SBP_HAVE_NVCC=1). */
#include "../src/streambp.h"

#ifndef SBP_HAVE_EMU
#define SBP_HAVE_EMU 1
#endif

extern "C" {
#if SBP_HAVE_EMU
const void *sbp_ops_cuda_emu_f32(void);
const void *sbp_ops_cuda_emu_f64(void);
#endif
#if SBP_HAVE_NVCC
const void *sbp_ops_cuda_f32(void);
const void *sbp_ops_cuda_f64(void);
#endif

/* The sbp_ops of device d in precision p, or NULL when this build does not have it. */
const void *sbp_cuda_ops(sbp_device d, sbp_precision p) {
#if SBP_HAVE_EMU
    if (d == SBP_DEVICE_CUDA_EMU)
        return p == SBP_FP64 ? sbp_ops_cuda_emu_f64() : sbp_ops_cuda_emu_f32();
#endif
#if SBP_HAVE_NVCC
    if (d == SBP_DEVICE_CUDA) return p == SBP_FP64 ? sbp_ops_cuda_f64() : sbp_ops_cuda_f32();
#endif
    return nullptr;
}

int sbp_device_built(sbp_device d) {
    return d == SBP_DEVICE_CPU || sbp_cuda_ops(d, SBP_FP32) != nullptr;
}
}
