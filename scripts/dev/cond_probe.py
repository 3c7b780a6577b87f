# Probe: can a kernel node of the embedded set-conditional fatbin be added to a graph?
import ctypes, sys
from cuda.bindings import driver as cu
def ck(r):
    err = r[0] if isinstance(r, tuple) else r
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(str(err))
    return r[1:] if isinstance(r, tuple) and len(r) > 1 else None
ck(cu.cuInit(0)); dev, = ck(cu.cuDeviceGet(0)); ctx, = ck(cu.cuDevicePrimaryCtxRetain(dev)); ck(cu.cuCtxSetCurrent(ctx))
data = open(sys.argv[1], 'rb').read()
mod, = ck(cu.cuModuleLoadData(data)); fn, = ck(cu.cuModuleGetFunction(mod, b"cuda_async_set_conditional"))
print("attrs: nregs", cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, fn))
g, = ck(cu.cuGraphCreate(0))
h, = ck(cu.cuGraphConditionalHandleCreate(g, ctx, 0, 0))
flag, = ck(cu.cuMemAlloc(4))
hv = ctypes.c_ulonglong(int(h)); fv = ctypes.c_ulonglong(int(flag))
args = (ctypes.c_void_p * 2)(ctypes.addressof(hv), ctypes.addressof(fv))
for variant in ("v1", "v2"):
    p = cu.CUDA_KERNEL_NODE_PARAMS()
    p.func = fn; p.gridDimX = p.gridDimY = p.gridDimZ = 1; p.blockDimX = p.blockDimY = p.blockDimZ = 1
    p.sharedMemBytes = 0; p.kernelParams = ctypes.addressof(args)
    try:
        r = cu.cuGraphAddKernelNode(g, None, 0, p)
        print(variant, "add kernel node:", r[0])
    except Exception as e:
        print(variant, "exception", e)
# Direct launch on a stream (outside a graph) for comparison.
s, = ck(cu.cuStreamCreate(1))
r = cu.cuLaunchKernel(fn, 1,1,1, 1,1,1, 0, s, ctypes.addressof(args), 0)
print("plain launch:", r, cu.cuStreamSynchronize(s))
