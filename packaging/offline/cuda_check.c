/* delegate-cuda-check: a CUDA program for the offline GPU check (docs/ml.md,
 * "An offline GPU check"). It uses the CUDA driver API through dlopen, so it
 * builds without a CUDA toolkit and runs wherever the NVIDIA driver's
 * libcuda.so.1 is: inside the sandbox, the image made from the host's
 * driver files brings it.
 *
 * On the first visible GPU it sets 1M 32-bit words to 41 (cuMemsetD32),
 * runs a PTX kernel (JIT-compiled by the driver) that adds each word's
 * index to it, copies the words back and checks every one. Prints one line
 * per step. Exit 0: every word right; 1: a CUDA call failed or a word is
 * wrong; 2: no driver library (no GPU given to this sandbox, or an image
 * without the driver's files).
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef uint64_t CUdeviceptr;

#define WORDS (1u << 20)
#define BLOCK 256u

static const char PTX[] =
    ".version 6.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    ".visible .entry add_index(.param .u64 words, .param .u32 n)\n"
    "{\n"
    "  .reg .pred %p<2>;\n"
    "  .reg .b32 %r<8>;\n"
    "  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [words];\n"
    "  ld.param.u32 %r1, [n];\n"
    "  mov.u32 %r2, %ctaid.x;\n"
    "  mov.u32 %r3, %ntid.x;\n"
    "  mov.u32 %r4, %tid.x;\n"
    "  mad.lo.s32 %r5, %r2, %r3, %r4;\n"
    "  setp.ge.u32 %p1, %r5, %r1;\n"
    "  @%p1 bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.u32 %rd3, %r5, 4;\n"
    "  add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.u32 %r6, [%rd4];\n"
    "  add.s32 %r7, %r6, %r5;\n"
    "  st.global.u32 [%rd4], %r7;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

struct cuda {
    CUresult (*init)(unsigned);
    CUresult (*driver_version)(int *);
    CUresult (*device_count)(int *);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_name)(char *, int, CUdevice);
    CUresult (*ctx_create)(CUcontext *, unsigned, CUdevice);
    CUresult (*module_load_data)(CUmodule *, const void *);
    CUresult (*module_function)(CUfunction *, CUmodule, const char *);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*memset_d32)(CUdeviceptr, unsigned, size_t);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       void *, void **, void **);
    CUresult (*synchronize)(void);
    CUresult (*copy_dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*error_string)(CUresult, const char **);
};

static struct cuda cu;

/* sym: the driver's function NAME, or exit 1 naming it. */
static void *sym(void *lib, const char *name)
{
    void *f = dlsym(lib, name);
    if (!f) {
        printf("cuda: the driver library has no %s\n", name);
        exit(1);
    }
    return f;
}

static void load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("cuda: no NVIDIA driver library in this sandbox (%s)\n", dlerror());
        exit(2);
    }
    *(void **)&cu.init = sym(lib, "cuInit");
    *(void **)&cu.driver_version = sym(lib, "cuDriverGetVersion");
    *(void **)&cu.device_count = sym(lib, "cuDeviceGetCount");
    *(void **)&cu.device_get = sym(lib, "cuDeviceGet");
    *(void **)&cu.device_name = sym(lib, "cuDeviceGetName");
    *(void **)&cu.ctx_create = sym(lib, "cuCtxCreate_v2");
    *(void **)&cu.module_load_data = sym(lib, "cuModuleLoadData");
    *(void **)&cu.module_function = sym(lib, "cuModuleGetFunction");
    *(void **)&cu.mem_alloc = sym(lib, "cuMemAlloc_v2");
    *(void **)&cu.memset_d32 = sym(lib, "cuMemsetD32_v2");
    *(void **)&cu.launch = sym(lib, "cuLaunchKernel");
    *(void **)&cu.synchronize = sym(lib, "cuCtxSynchronize");
    *(void **)&cu.copy_dtoh = sym(lib, "cuMemcpyDtoH_v2");
    *(void **)&cu.error_string = sym(lib, "cuGetErrorString");
}

/* check: exit 1 naming the step when a CUDA call failed. */
static void check(CUresult r, const char *step)
{
    const char *msg = "unknown error";
    if (r == 0)
        return;
    if (cu.error_string(r, &msg) != 0 || !msg)
        msg = "unknown error";
    printf("cuda: %s failed: %s (%d)\n", step, msg, r);
    exit(1);
}

int main(void)
{
    int version = 0, count = 0;
    unsigned n = WORDS, bad = 0;
    char name[256] = "";
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUdeviceptr words;
    uint32_t *host = malloc(WORDS * sizeof *host);

    if (!host)
        return 1;
    load();
    check(cu.init(0), "cuInit");
    check(cu.driver_version(&version), "cuDriverGetVersion");
    check(cu.device_count(&count), "cuDeviceGetCount");
    printf("cuda: driver API %d.%d, %d device(s) visible\n", version / 1000, version % 1000 / 10, count);
    if (count < 1) {
        printf("cuda: no device visible\n");
        return 1;
    }
    check(cu.device_get(&dev, 0), "cuDeviceGet");
    check(cu.device_name(name, sizeof name - 1, dev), "cuDeviceGetName");
    check(cu.ctx_create(&ctx, 0, dev), "cuCtxCreate");
    check(cu.module_load_data(&mod, PTX), "cuModuleLoadData (the PTX kernel)");
    check(cu.module_function(&fn, mod, "add_index"), "cuModuleGetFunction");
    check(cu.mem_alloc(&words, WORDS * sizeof *host), "cuMemAlloc");
    check(cu.memset_d32(words, 41, WORDS), "cuMemsetD32");
    void *args[] = {&words, &n};
    check(cu.launch(fn, (WORDS + BLOCK - 1) / BLOCK, 1, 1, BLOCK, 1, 1, 0, NULL, args, NULL), "cuLaunchKernel");
    check(cu.synchronize(), "cuCtxSynchronize");
    check(cu.copy_dtoh(host, words, WORDS * sizeof *host), "cuMemcpyDtoH");
    for (unsigned i = 0; i < WORDS; i++)
        bad += host[i] != 41u + i;
    printf("cuda: %s: memset, kernel over %u words, copy back: %s\n", name, WORDS,
           bad ? "WRONG" : "every word right");
    if (bad)
        printf("cuda: %u of %u words wrong\n", bad, WORDS);
    free(host);
    return bad ? 1 : 0;
}
