// Elementwise kernels. Every kernel takes the element count `n` and uses a grid-stride loop, so
// any grid size is correct and no thread touches an index >= n.
// Instantiated for float (_f32) and double (_f64) at the bottom.

template <typename T>
__device__ void fill_impl(T* __restrict__ out, T value, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = value;
}

template <typename T>
__device__ void scale_impl(const T* __restrict__ x, T alpha, T* __restrict__ out, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = alpha * x[i];
}

template <typename T>
__device__ void scale_by_impl(const T* __restrict__ x, const T* __restrict__ alpha, T* __restrict__ out, unsigned long long n) {
    const T a = *alpha;  // read on the device at run time: a graph replay sees the current value
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = a * x[i];
}

template <typename T>
__device__ void axpy_impl(T alpha, const T* __restrict__ x, T* __restrict__ y, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        y[i] = alpha * x[i] + y[i];
}

template <typename T>
__device__ void add_impl(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

template <typename T>
__device__ void mul_impl(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = a[i] * b[i];
}

#define INSTANTIATE(T, S)                                                                          \
    extern "C" __global__ void fill_##S(T* out, T value, unsigned long long n) { fill_impl(out, value, n); } \
    extern "C" __global__ void scale_##S(const T* x, T alpha, T* out, unsigned long long n) { scale_impl(x, alpha, out, n); } \
    extern "C" __global__ void scale_by_##S(const T* x, const T* alpha, T* out, unsigned long long n) { scale_by_impl(x, alpha, out, n); } \
    extern "C" __global__ void axpy_##S(T alpha, const T* x, T* y, unsigned long long n) { axpy_impl(alpha, x, y, n); } \
    extern "C" __global__ void add_##S(const T* a, const T* b, T* out, unsigned long long n) { add_impl(a, b, out, n); } \
    extern "C" __global__ void mul_##S(const T* a, const T* b, T* out, unsigned long long n) { mul_impl(a, b, out, n); }

INSTANTIATE(float, f32)
INSTANTIATE(double, f64)
