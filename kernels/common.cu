/* kernels/common.cu - host helpers declared in kernels/common.cuh. */
#include "kernels/common.cuh"

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
