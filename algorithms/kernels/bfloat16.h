/* bfloat16 arithmetic on 16-bit words: one text, compiled by NVRTC as CUDA C++ for the GPU's
 * reductions (algorithms/bf16_kernels.py) and by gcc as C99 for the test that checks it bit for
 * bit against ml_dtypes and PyTorch (tests/test_bf16_kernel.py).
 *
 * A word is a bfloat16's bits, the top half of a float32's. add, mul and div widen their operands
 * to float32 (exactly), compute once in float32 and round back to nearest, ties to even, as
 * ml_dtypes (Eigen's float_to_bfloat16_rtne) and PyTorch do:
 * (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16, subnormals kept, overflow to infinity. A NaN result
 * becomes 0x7FC0, the quiet NaN c10::BFloat16's scalar conversion makes, whatever the operands:
 * ml_dtypes gives +-0x7FC0 with the float32 NaN's sign, which the CPU's own NaN rules choose
 * (x86 makes inf - inf negative), and PyTorch's vectorized kernels 0xFFFF, so the host's NaN bits
 * vary and the suite does not pin the sign or payload of an arithmetic NaN. max and min return one
 * of their two words unchanged, by ml_dtypes' rule (bf16_max), NaN payloads included.
 *
 * On the device, float32 add, mul and div are PTX instructions without .ftz: CuPy compiles
 * every module with -ftz=true after the caller's options (cupy/cupy#9576), which would flush
 * subnormal operands and results of C's operators to zero. Comparisons are on integers. */
#ifndef ALLREDUCE_BFLOAT16_H
#define ALLREDUCE_BFLOAT16_H

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define BF16_DEVICE 1
#endif

#ifndef BF16_FN
#ifdef BF16_DEVICE
#define BF16_FN __device__ __forceinline__
#else
#define BF16_FN static inline
#endif
#endif

#ifdef BF16_DEVICE
BF16_FN float bf16_as_float(unsigned int u) { return __uint_as_float(u); }
BF16_FN unsigned int bf16_as_bits(float f) { return __float_as_uint(f); }
/* float32 x (op) y, rounded to nearest, subnormals kept */
#define BF16_PTX(name, op)                                                                         \
    BF16_FN float name(float x, float y)                                                           \
    {                                                                                              \
        float r;                                                                                   \
        asm(op " %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));                                         \
        return r;                                                                                  \
    }
BF16_PTX(bf16_fadd, "add.rn.f32")
BF16_PTX(bf16_fmul, "mul.rn.f32")
BF16_PTX(bf16_fdiv, "div.rn.f32")
#else
#include <string.h>
BF16_FN float bf16_as_float(unsigned int u) { float f; memcpy(&f, &u, sizeof f); return f; }
BF16_FN unsigned int bf16_as_bits(float f) { unsigned int u; memcpy(&u, &f, sizeof u); return u; }
/* IEEE binary32 as long as nothing contracts or flushes: -ffp-contract=off, no -ffast-math */
BF16_FN float bf16_fadd(float x, float y) { return x + y; }
BF16_FN float bf16_fmul(float x, float y) { return x * y; }
BF16_FN float bf16_fdiv(float x, float y) { return x / y; }
#endif

BF16_FN int bf16_isnan(unsigned short w) { return (w & 0x7FFF) > 0x7F80; }

BF16_FN float bf16_to_float(unsigned short w) { return bf16_as_float((unsigned int)w << 16); }

BF16_FN unsigned short float_to_bf16(float f)
{
    unsigned int u = bf16_as_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return 0x7FC0;
    return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

BF16_FN unsigned short bf16_add(unsigned short a, unsigned short b)
{
    return float_to_bf16(bf16_fadd(bf16_to_float(a), bf16_to_float(b)));
}

BF16_FN unsigned short bf16_mul(unsigned short a, unsigned short b)
{
    return float_to_bf16(bf16_fmul(bf16_to_float(a), bf16_to_float(b)));
}

/* avg's last step, w / d: d is the rank count as a float32 (exact up to 2^24) */
BF16_FN unsigned short bf16_div(unsigned short w, float d)
{
    return float_to_bf16(bf16_fdiv(bf16_to_float(w), d));
}

/* A non-NaN word's place in float order: -0 and +0 tie, as they compare equal. */
BF16_FN int bf16_rank(unsigned short w) { return w & 0x8000 ? -(int)(w & 0x7FFF) : (int)w; }

/* ml_dtypes' maximum and minimum: a if a is NaN or a > b (a < b), else b. So a NaN operand wins
 * (a first when both are), and equal operands, -0 and +0 among them, give b. */
BF16_FN unsigned short bf16_max(unsigned short a, unsigned short b)
{
    return bf16_isnan(a) || (!bf16_isnan(b) && bf16_rank(a) > bf16_rank(b)) ? a : b;
}

BF16_FN unsigned short bf16_min(unsigned short a, unsigned short b)
{
    return bf16_isnan(a) || (!bf16_isnan(b) && bf16_rank(a) < bf16_rank(b)) ? a : b;
}

#ifdef BF16_DEVICE
/* Grid-stride loops over n elements; out may be a or b: each element's inputs are read before
 * its output is written. */
#define BF16_BINARY_KERNEL(name, op)                                                               \
    extern "C" __global__ void name(const unsigned short *a, const unsigned short *b,              \
                                    unsigned short *out, long long n)                              \
    {                                                                                              \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;                \
             i += (long long)gridDim.x * blockDim.x)                                               \
            out[i] = op(a[i], b[i]);                                                               \
    }
BF16_BINARY_KERNEL(bf16_add_kernel, bf16_add)
BF16_BINARY_KERNEL(bf16_mul_kernel, bf16_mul)
BF16_BINARY_KERNEL(bf16_max_kernel, bf16_max)
BF16_BINARY_KERNEL(bf16_min_kernel, bf16_min)

extern "C" __global__ void bf16_div_kernel(const unsigned short *a, float d, unsigned short *out, long long n)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = bf16_div(a[i], d);
}
#endif

#endif
