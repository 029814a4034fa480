/* cuda-probe: the smallest CUDA program that proves a container can compute on its GPU.
 *
 * Loads the driver's libcuda.so.1 the way the CUDA runtime does (dlopen by soname, so it must
 * be in the container's ld.so.cache or library path: actk mounts it with the `compute`
 * capability), then cuInit, counts the devices, and on device 0 creates a context, allocates
 * 64 MiB, writes a pattern with cuMemsetD32 and reads it back. Needs /dev/nvidiactl,
 * /dev/nvidia-uvm and the GPU's /dev/nvidiaN in the container: cuInit or the allocation fails
 * without them. Uses the CUDA driver API only (no CUDA toolkit to build it: any C compiler,
 * `cc -O2 -o cuda-probe cuda-probe.c -ldl`).
 *
 * Prints one line, "cuda: N device(s); device 0: NAME, 64 MiB allocated and checked", exit 0;
 * else "cuda: <call> failed: <error code and name>" and exit 1.
 * Run by scripts/gpu-check (check `compute`).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static void *lib;
static const char *err_name(CUresult r) {
    const char *s = "?";
    CUresult (*f)(CUresult, const char **) = (CUresult (*)(CUresult, const char **))dlsym(lib, "cuGetErrorName");
    if (f != NULL && f(r, &s) != 0) s = "?";
    return s;
}
#define SYM(name, ret, args) ret (*name) args = (ret (*) args)dlsym(lib, #name); \
    if (name == NULL) { printf("cuda: %s not found in libcuda.so.1\n", #name); return 1; }
#define CHECK(call) do { CUresult r_ = (call); \
    if (r_ != 0) { printf("cuda: %s failed: %d (%s)\n", #call, r_, err_name(r_)); return 1; } } while (0)

int main(void) {
    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL) { printf("cuda: dlopen libcuda.so.1 failed: %s\n", dlerror()); return 1; }
    SYM(cuInit, CUresult, (unsigned));
    SYM(cuDeviceGetCount, CUresult, (int *));
    SYM(cuDeviceGet, CUresult, (CUdevice *, int));
    SYM(cuDeviceGetName, CUresult, (char *, int, CUdevice));
    SYM(cuCtxCreate_v2, CUresult, (CUcontext *, unsigned, CUdevice));
    SYM(cuMemAlloc_v2, CUresult, (CUdeviceptr *, size_t));
    SYM(cuMemsetD32_v2, CUresult, (CUdeviceptr, unsigned, size_t));
    SYM(cuMemcpyDtoH_v2, CUresult, (void *, CUdeviceptr, size_t));
    SYM(cuMemFree_v2, CUresult, (CUdeviceptr));
    SYM(cuCtxDestroy_v2, CUresult, (CUcontext));
    int n = 0;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    char name[256];
    const size_t words = 16u << 20; /* 64 MiB of 32-bit words */
    CHECK(cuInit(0));
    CHECK(cuDeviceGetCount(&n));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDeviceGetName(name, sizeof name, dev));
    CHECK(cuCtxCreate_v2(&ctx, 0, dev));
    CHECK(cuMemAlloc_v2(&p, words * 4));
    CHECK(cuMemsetD32_v2(p, 0xac7cu, words));
    unsigned *h = malloc(words * 4);
    if (h == NULL) { printf("cuda: out of host memory\n"); return 1; }
    CHECK(cuMemcpyDtoH_v2(h, p, words * 4));
    for (size_t i = 0; i < words; i++) {
        if (h[i] != 0xac7cu) { printf("cuda: word %zu read back as %#x, wrote 0xac7c\n", i, h[i]); return 1; }
    }
    CHECK(cuMemFree_v2(p));
    CHECK(cuCtxDestroy_v2(ctx));
    printf("cuda: %d device(s); device 0: %s, 64 MiB allocated and checked\n", n, name);
    return 0;
}
