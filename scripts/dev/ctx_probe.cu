// ctx_probe: which hot-path driver calls depend on the calling thread's current context, and what
// cuCtxGetCurrent costs. Built and run on the GPU host (nvcc ctx_probe.cu -lcuda -o ctx_probe):
// a stream, module, event, memory and graph are made in the primary context; then another context
// (or none) is made current and each call is tried on the primary context's handles, its return
// code printed and the work's result checked. Development tool, not part of the library.
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char* PTX =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry inc(.param .u64 p){\n .reg .u64 %a; .reg .u32 %v;\n"
    " ld.param.u64 %a,[p]; cvta.to.global.u64 %a,%a;\n"
    " atom.global.add.u32 %v,[%a],1;\n ret;\n}\n";

static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* s; cuGetErrorName(r_, &s); printf("FATAL %s = %s (line %d)\n", #x, s, __LINE__); exit(1); } } while (0)
static const char* name(CUresult r) { const char* s = "?"; cuGetErrorName(r, &s); return s; }

int main() {
  CK(cuInit(0));
  CUdevice dev; CK(cuDeviceGet(&dev, 0));
  CUcontext P; CK(cuDevicePrimaryCtxRetain(&P, dev)); CK(cuCtxSetCurrent(P));
  int drv; cuDriverGetVersion(&drv); printf("driver API version %d\n", drv);
  // cost of the per-bind check
  CUcontext cur; const int N = 10000000;
  double t0 = now(); for (int i = 0; i < N; i++) cuCtxGetCurrent(&cur); double t1 = now();
  printf("cuCtxGetCurrent: %.2f ns/call\n", (t1 - t0) / N * 1e9);
  t0 = now(); for (int i = 0; i < N / 10; i++) cuCtxSetCurrent(P); t1 = now();
  printf("cuCtxSetCurrent(same): %.2f ns/call\n", (t1 - t0) / (N / 10) * 1e9);
  CUmodule m; CK(cuModuleLoadData(&m, PTX)); CUfunction f; CK(cuModuleGetFunction(&f, m, "inc"));
  CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr d; CK(cuMemAlloc(&d, 4096)); CK(cuMemsetD32(d, 0, 1024));
  CUevent ev; CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  void* args[] = {&d};
  // launch throughput with and without the check
  const int L = 200000;
  for (int rep = 0; rep < 3; rep++) {
    t0 = now(); for (int i = 0; i < L; i++) { cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args, 0); } CK(cuStreamSynchronize(s)); t1 = now();
    double plain = (t1 - t0) / L * 1e6;
    t0 = now(); for (int i = 0; i < L; i++) { cuCtxGetCurrent(&cur); if (cur != P) cuCtxSetCurrent(P); cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args, 0); } CK(cuStreamSynchronize(s)); t1 = now();
    printf("launch: %.4f us plain, %.4f us with get-current check\n", plain, (t1 - t0) / L * 1e6);
  }
  // a graph of one launch, made in P
  CUgraph g; CK(cuGraphCreate(&g, 0));
  CUDA_KERNEL_NODE_PARAMS kp; memset(&kp, 0, sizeof kp);
  kp.func = f; kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1; kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1; kp.kernelParams = args;
  CUgraphNode n; CK(cuGraphAddKernelNode(&n, g, 0, 0, &kp));
  CUgraphExec ge; CK(cuGraphInstantiate(&ge, g, 0));
  CK(cuMemsetD32(d, 0, 1024)); CK(cuCtxSynchronize());
  unsigned expect = 0;
  CUcontext C2;
#if CUDA_VERSION >= 12050
  CK(cuCtxCreate(&C2, NULL, 0, dev));
#else
  CK(cuCtxCreate(&C2, 0, dev));
#endif
  for (int mode = 0; mode < 2; mode++) {
    if (mode == 0) { CK(cuCtxSetCurrent(C2)); printf("--- another context current\n"); }
    else { CK(cuCtxSetCurrent(NULL)); printf("--- no context current\n"); }
    CUresult r;
    r = cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args, 0); printf("cuLaunchKernel(P's f, P's stream): %s\n", name(r)); if (!r) expect++;
    CUlaunchAttribute at; memset(&at, 0, sizeof at); at.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION; at.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig lc; memset(&lc, 0, sizeof lc); lc.gridDimX = lc.gridDimY = lc.gridDimZ = 1; lc.blockDimX = lc.blockDimY = lc.blockDimZ = 1; lc.hStream = s; lc.attrs = &at; lc.numAttrs = 1;
    r = cuLaunchKernelEx(&lc, f, args, 0); printf("cuLaunchKernelEx: %s\n", name(r)); if (!r) expect++;
    r = cuGraphLaunch(ge, s); printf("cuGraphLaunch: %s\n", name(r)); if (!r) expect++;
    r = cuEventRecord(ev, s); printf("cuEventRecord: %s\n", name(r));
    r = cuStreamWaitEvent(s, ev, 0); printf("cuStreamWaitEvent: %s\n", name(r));
    r = cuEventQuery(ev); printf("cuEventQuery: %s\n", name(r));
    r = cuStreamQuery(s); printf("cuStreamQuery: %s\n", name(r));
    unsigned host[4] = {0};
    r = cuMemcpyHtoDAsync(d + 64, host, 4, s); printf("cuMemcpyHtoDAsync(pageable): %s\n", name(r));
    r = cuMemsetD32Async(d + 128, 7, 1, s); printf("cuMemsetD32Async: %s\n", name(r));
    CUdeviceptr a = 0; r = cuMemAllocAsync(&a, 256, s); printf("cuMemAllocAsync: %s\n", name(r));
    if (!r) { r = cuMemFreeAsync(a, s); printf("cuMemFreeAsync: %s\n", name(r)); }
    r = cuStreamSynchronize(s); printf("cuStreamSynchronize: %s\n", name(r));
    r = cuEventSynchronize(ev); printf("cuEventSynchronize: %s\n", name(r));
    CUcontext sc = 0; r = cuStreamGetCtx(s, &sc); printf("cuStreamGetCtx: %s (%s)\n", name(r), sc == P ? "P" : "other");
    CUcontext now_ = 0; cuCtxGetCurrent(&now_); printf("current after: %s\n", now_ == P ? "P" : now_ == C2 ? "C2" : now_ ? "?" : "none");
    unsigned got = 0; CK(cuCtxSetCurrent(P)); CK(cuMemcpyDtoH(&got, d, 4));
    printf("counter %u, launches accepted %u: %s\n", got, expect, got == expect ? "equal" : "DIFFERENT");
  }
  printf("probe done\n");
  return 0;
}
