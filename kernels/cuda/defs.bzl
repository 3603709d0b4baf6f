"""cuda_library: compiles .cu sources with nvcc for sm_80 and sm_90 into a cc_library."""

_NVCC = "/usr/local/cuda/bin/nvcc"

_GENCODE = " ".join([
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_90,code=compute_90",
])

def cuda_library(name, srcs, hdrs = [], deps = [], nvcc_flags = [], gencode = _GENCODE, **kwargs):
    """One nvcc object per .cu file, linked into a cc_library named `name`.

    Args:
      name: the cc_library's name.
      srcs: .cu files.
      hdrs: headers the library's users include (every header of the package is
        visible to the .cu files).
      deps: cc_library targets whose headers the .cu files need (headers only).
      nvcc_flags: extra nvcc flags.
      gencode: the -gencode flags (default: sm_80, sm_90, sm_90a and
        compute_90 PTX).
      **kwargs: passed to the cc_library.
    """
    objs = []
    for src in srcs:
        obj = "_%s_%s.o" % (name, src.replace("/", "_").replace(".cu", ""))
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + native.glob(["**/*.h", "**/*.cuh"]),
            outs = [obj],
            # nvcc names its temporaries after its process id, which is the
            # same in every sandbox's PID namespace: a directory of its own
            # keeps parallel compilations from overwriting each other's.
            cmd = " ".join([
                "export TMPDIR=$$(mktemp -d) && trap 'rm -rf \"$$TMPDIR\"' EXIT &&",
                _NVCC,
                "-c -O3 -std=c++17 -Xcompiler -fPIC -ccbin /usr/bin/g++",
                "--expt-relaxed-constexpr",
                "-I. -I$(GENDIR) -I/usr/local/cuda/include",
                gencode,
            ] + nvcc_flags + ["-o $@ $(location %s)" % src]),
            tags = ["cuda"],
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        alwayslink = True,
        **kwargs
    )
