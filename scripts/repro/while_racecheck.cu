// Minimal CUDA C reproduction of gpu_graph_build::conditional_while_counts_to_n without this
// project's code: a graph with a WHILE conditional node whose body is a kernel that counts and
// decides, then a kernel that calls cudaGraphSetConditional (as cuda-core's set_conditional.cu
// does). Used to tell a fault of ours from a limit of compute-sanitizer racecheck, under which the
// Rust test's process died with no hazard reported (docs/results/gpu-runs-2026-11-27b.md). Found
// since (docs/results/gpu-runs-2026-11-27d.md): the Rust test dies only while another sanitizer
// process shares the GPU, and the fault is in the tool's own library (libsanitizer-collection.so,
// on a thread of its own, address 0x1b); this program, run between those deaths beside the same
// neighbour, stayed clean (modes while and edges, 6 of 6 each), so it does not reproduce the
// tool's fault.
//   nvcc -arch=sm_90 -rdc=true scripts/repro/while_racecheck.cu -lcudadevrt -o /tmp/while_racecheck
//   /tmp/while_racecheck MODE    MODE: while (as the test), while1 (the body one kernel that sets
//                                the condition itself), if (an IF node, for comparison), edges
//                                (as while, plus memset nodes of the counter and the accumulator
//                                before it and edges from them to the WHILE node added after it
//                                was created, as cuda-core's builder orders conflicting nodes)
//   compute-sanitizer --tool racecheck /tmp/while_racecheck while
// Prints "repro MODE: ok" and exits 0 when every launch counted right; exits 1 on a CUDA error
// or a wrong count.
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

#define CK(x)                                                                             \
    do {                                                                                  \
        cudaError_t e_ = (x);                                                             \
        if (e_ != cudaSuccess) {                                                          \
            std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)

__global__ void loop_init(const unsigned* limit, unsigned* flag, unsigned* counter) {
    if (threadIdx.x == 0) {
        *counter = 0u;
        *flag = 0u < *limit ? 1u : 0u;
    }
}
// As the test's loop_step: every thread adds 1 to its elements, a barrier, thread 0 decides.
__global__ void loop_step(unsigned* counter, const unsigned* limit, unsigned* flag, float* acc, unsigned long long n) {
    for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) acc[i] += 1.0f;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned c = *counter + 1u;
        *counter = c;
        *flag = c < *limit ? 1u : 0u;
    }
}
__global__ void set_cond(cudaGraphConditionalHandle h, const unsigned* flag) {
    if (blockIdx.x == 0 && threadIdx.x == 0) cudaGraphSetConditional(h, *flag ? 1u : 0u);
}
// while1: the step decides and sets the condition itself.
__global__ void step_and_set(cudaGraphConditionalHandle h, unsigned* counter, const unsigned* limit) {
    __shared__ unsigned c;
    if (threadIdx.x == 0) c = *counter + 1u;
    __syncthreads();
    if (threadIdx.x == 0) {
        *counter = c;
        cudaGraphSetConditional(h, c < *limit ? 1u : 0u);
    }
}

static cudaError_t add_node(cudaGraphNode_t* node, cudaGraph_t g, const cudaGraphNode_t* deps, size_t n,
                            cudaGraphNodeParams* p) {
#if CUDART_VERSION >= 13000
    return cudaGraphAddNode(node, g, deps, nullptr, n, p);
#else
    return cudaGraphAddNode(node, g, deps, n, p);
#endif
}

static cudaError_t add_kernel(cudaGraphNode_t* node, cudaGraph_t g, const cudaGraphNode_t* deps, size_t n,
                              void* fn, unsigned threads, void** args) {
    cudaKernelNodeParams k = {};
    k.func = fn;
    k.gridDim = dim3(1);
    k.blockDim = dim3(threads);
    k.kernelParams = args;
    return cudaGraphAddKernelNode(node, g, deps, n, &k);
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "while";
    const bool is_if = std::strcmp(mode, "if") == 0, one = std::strcmp(mode, "while1") == 0;
    const bool edges = std::strcmp(mode, "edges") == 0;
    const unsigned long long n = 3000;
    unsigned *limit, *flag, *counter;
    float* acc;
    CK(cudaMalloc(&limit, 4));
    CK(cudaMalloc(&flag, 4));
    CK(cudaMalloc(&counter, 4));
    CK(cudaMalloc(&acc, n * 4));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cudaGraph_t g;
    CK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle h;
    CK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
    cudaGraphNode_t init, set, cond;
    void* init_args[] = {&limit, &flag, &counter};
    CK(add_kernel(&init, g, nullptr, 0, (void*)loop_init, 1, init_args));
    void* set_args[] = {&h, &flag};
    CK(add_kernel(&set, g, &init, 1, (void*)set_cond, 1, set_args));
    cudaGraphNodeParams cp = {};
    cp.type = cudaGraphNodeTypeConditional;
    cp.conditional.handle = h;
    cp.conditional.type = is_if ? cudaGraphCondTypeIf : cudaGraphCondTypeWhile;
    cp.conditional.size = 1;
    CK(add_node(&cond, g, &set, 1, &cp));
    if (edges) {
        cudaMemsetParams m = {};
        m.dst = acc;
        m.value = 0;
        m.elementSize = 4;
        m.width = n;
        m.height = 1;
        cudaGraphNode_t z[2];
        CK(cudaGraphAddMemsetNode(&z[0], g, nullptr, 0, &m));
        m.dst = counter;
        m.width = 1;
        CK(cudaGraphAddMemsetNode(&z[1], g, nullptr, 0, &m));
        cudaGraphNode_t to[2] = {cond, cond};
#if CUDART_VERSION >= 13000
        CK(cudaGraphAddDependencies(g, z, to, nullptr, 2));
#else
        CK(cudaGraphAddDependencies(g, z, to, 2));
#endif
    }
    cudaGraph_t body = cp.conditional.phGraph_out[0];
    cudaGraphNode_t step, bset;
    if (one) {
        void* a[] = {&h, &counter, &limit};
        CK(add_kernel(&step, body, nullptr, 0, (void*)step_and_set, 256, a));
    } else {
        void* a[] = {&counter, &limit, &flag, &acc, (void*)&n};
        CK(add_kernel(&step, body, nullptr, 0, (void*)loop_step, 256, a));
        if (!is_if) CK(add_kernel(&bset, body, &step, 1, (void*)set_cond, 1, set_args));
    }
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, g, 0));
    const unsigned limits[] = {7, 33, 0};
    for (unsigned want : limits) {
        CK(cudaMemcpyAsync(limit, &want, 4, cudaMemcpyHostToDevice, s));
        CK(cudaGraphLaunch(exec, s));
        unsigned got = 12345;
        CK(cudaMemcpyAsync(&got, counter, 4, cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        const unsigned expect = is_if ? (want > 0 ? 1u : 0u) : want;
        std::printf("repro %s: limit %u, counter %u (expected %u)\n", mode, want, got, expect);
        if (got != expect) return 1;
    }
    std::printf("repro %s: ok\n", mode);
    return 0;
}
