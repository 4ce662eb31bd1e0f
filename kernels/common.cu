/* kernels/common.cu - host helpers declared in kernels/common.cuh. */
#include "kernels/common.cuh"

#include "common/check.h"

int mv_num_sms(void) {
    static int cached_device = -1, cached_sms = 0;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 1;
    if (dev != cached_device) {
        int sms = 0;
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms < 1)
            sms = 1;
        cached_sms = sms;
        cached_device = dev;
    }
    return cached_sms;
}

// Per host thread: a launch in one thread is not affected by another's switch.
static __thread int pdl_on = 0;

extern "C" int mv_pdl_supported(void) {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return 0;
    return major >= 9;
}

extern "C" int mv_pdl_set(int on) {
    if (on && !mv_pdl_supported())
        return mv_error("programmatic dependent launch needs compute capability 9.0 or newer");
    pdl_on = on ? 1 : 0;
    return 0;
}

extern "C" int mv_pdl_enabled(void) { return pdl_on; }
