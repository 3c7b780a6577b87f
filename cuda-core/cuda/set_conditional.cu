// The one kernel that sets a CUDA graph conditional handle on the device.
//
// cudaGraphSetConditional lives in the CUDA device runtime (libcudadevrt), which NVRTC cannot
// link on a machine without the CUDA toolkit. So this kernel is compiled once, offline, with nvcc
// (scripts/build-set-conditional.sh) into cuda/set_conditional.fatbin, which cuda-core embeds.
// User kernels (compiled by NVRTC) write the wanted condition into ordinary device memory; this
// kernel, placed after them in the graph, reads it and applies it.
#include <cuda_runtime.h>

extern "C" __global__ void cuda_async_set_conditional(cudaGraphConditionalHandle handle, const unsigned int* flag) {
    if (blockIdx.x == 0 && threadIdx.x == 0) cudaGraphSetConditional(handle, *flag ? 1u : 0u);
}
