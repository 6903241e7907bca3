"""The CUDA kernel sources (csrc/cuda/*.cu): their signatures, and their two builds.

- For a GPU: `build_fatbins` runs nvcc once per source into `<name>.fatbin` (SASS for every architecture this nvcc
  has from sm_70 to sm_90, plus PTX of the newest, which newer GPUs compile when they load it). pycuda loads them.
- For the host: `build_host_library` compiles the same sources with g++ into one shared library in which each
  kernel runs its whole grid in one thread (csrc/cuda/common.cuh). The emulated device (backend/emulated.py)
  calls it, so the GPU code path is tested on machines without a GPU.

setup.py runs both builds (the first where nvcc exists); a source checkout rebuilds the host library when a
source is newer (`ensure_host_library`). This module imports nothing of the package: setup.py loads it by path.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

PACKAGE = pathlib.Path(__file__).resolve().parent.parent
SOURCE_DIR = PACKAGE.parent / "csrc" / "cuda"
BUILD_DIR = PACKAGE / "_kernels" / "cuda"          # fatbins, the host library and signatures.json
HOST_LIBRARY = BUILD_DIR / "host_emulation.so"
SIGNATURES = BUILD_DIR / "signatures.json"
ARCHS = (70, 75, 80, 86, 89, 90)                    # sm_70 (V100) to sm_90 (H100), where this nvcc has them

_DECLARATION = re.compile(r"PCD_KERNEL\s+void\s+(\w+)\s*\(([^)]*)\)")
# A parameter's C type -> its letter in pycuda's prepared-call format ("i" int32, "f" float32, "P" a pointer).
_TYPE_CODES = [(re.compile(r"\*"), "P"), (re.compile(r"^(const\s+)?(int|unsigned)\b"), "i"),
               (re.compile(r"^(const\s+)?float\b"), "f")]


class KernelSourceError(Exception):
    pass


def sources(directory=SOURCE_DIR):
    return sorted(pathlib.Path(directory).glob("*.cu"))


def parse_signatures(text, where="source"):
    """{kernel name: argument codes}, e.g. {"relu_forward": "iPPf"}, from the PCD_KERNEL declarations."""
    out = {}
    for match in _DECLARATION.finditer(text):
        name, params = match.group(1), [p.strip() for p in match.group(2).split(",") if p.strip()]
        codes = ""
        for param in params:
            code = next((c for pattern, c in _TYPE_CODES if pattern.search(param)), None)
            if code is None:
                raise KernelSourceError("%s: kernel %s: parameter %r is not an int, a float or a pointer"
                                        % (where, name, param))
            codes += code
        if not codes.startswith("i"):
            raise KernelSourceError("%s: kernel %s must take its thread count (an int) first" % (where, name))
        if name in out:
            raise KernelSourceError("%s: kernel %s is declared twice" % (where, name))
        out[name] = codes
    return out


def source_signatures(directory=SOURCE_DIR):
    """{source stem: {kernel: codes}} over every .cu file; a kernel name must be unique across files."""
    table, seen = {}, {}
    for path in sources(directory):
        table[path.stem] = parse_signatures(path.read_text(), str(path))
        for name in table[path.stem]:
            if name in seen:
                raise KernelSourceError("kernel %s is declared in both %s.cu and %s.cu" % (name, seen[name], path.stem))
            seen[name] = path.stem
    return table


def load_signatures():
    """The table written by the last build: kernels of a wheel are found without their sources."""
    if SOURCE_DIR.is_dir():
        return source_signatures()
    if not SIGNATURES.exists():
        raise KernelSourceError("%s is missing: this installation was built without its CUDA kernels" % SIGNATURES)
    return json.loads(SIGNATURES.read_text())


def write_signatures(out_dir=BUILD_DIR):
    pathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)
    (pathlib.Path(out_dir) / "signatures.json").write_text(json.dumps(source_signatures(), indent=1, sort_keys=True))


# --- the host build ------------------------------------------------------------------------------------------

def host_compile_command(out, cxx=None):
    # -ffp-contract=off: a * b + c rounds twice, as the CPU kernels do, so emulated and CPU results can be compared
    # closely; on the GPU nvcc contracts to FMA, as it does for Caffe's kernels.
    return [cxx or os.environ.get("CXX", "g++"), "-O2", "-fPIC", "-shared", "-std=c++14", "-ffp-contract=off",
            "-I", str(SOURCE_DIR), "-x", "c++"] + [str(p) for p in sources()] + ["-o", str(out)]


def build_host_library(out=HOST_LIBRARY):
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: a test run loading the library never sees half a file.
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        partial = pathlib.Path(tmp) / out.name
        result = subprocess.run(host_compile_command(partial), capture_output=True, text=True)
        if result.returncode:
            raise KernelSourceError("compiling csrc/cuda for the host failed:\n" + result.stderr[-4000:])
        os.replace(partial, out)
    write_signatures(out.parent)
    return out


def ensure_host_library():
    """The host library, rebuilt first when a source checkout's csrc/cuda is newer than it."""
    if SOURCE_DIR.is_dir():
        newest = max(p.stat().st_mtime for p in list(sources()) + [SOURCE_DIR / "common.cuh"])
        if not HOST_LIBRARY.exists() or HOST_LIBRARY.stat().st_mtime < newest:
            build_host_library()
    if not HOST_LIBRARY.exists():
        raise KernelSourceError("%s is missing: reinstall the package (its build compiles csrc/cuda for the host)"
                                % HOST_LIBRARY)
    return HOST_LIBRARY


# --- the GPU build -----------------------------------------------------------------------------------------------

def find_nvcc():
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    candidate = pathlib.Path(home) / "bin" / "nvcc"
    return str(candidate) if candidate.exists() else None


def nvcc_archs(nvcc):
    """The architectures of ARCHS this nvcc can compile for (CUDA 13 dropped sm_70, for one)."""
    result = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True)
    listed = {int(m) for m in re.findall(r"compute_(\d+)", result.stdout)} if result.returncode == 0 else set()
    return [a for a in ARCHS if a in listed] if listed else list(ARCHS[1:])


def nvcc_command(nvcc, source, out, archs):
    gencode = []
    for arch in archs:
        gencode += ["-gencode", "arch=compute_%d,code=sm_%d" % (arch, arch)]
    gencode += ["-gencode", "arch=compute_%d,code=compute_%d" % (archs[-1], archs[-1])]
    return [nvcc, "-fatbin", "-O3", "-std=c++14", "-I", str(SOURCE_DIR)] + gencode + [str(source), "-o", str(out)]


def build_fatbins(out_dir=BUILD_DIR, nvcc=None, jobs=2):
    """Compile every source with nvcc; returns the fatbins. Sources compile `jobs` at a time."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise KernelSourceError("nvcc was not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    archs = nvcc_archs(nvcc)
    pending, outputs = list(sources()), []
    while pending:
        batch, pending = pending[:jobs], pending[jobs:]
        procs = [(src, subprocess.Popen(nvcc_command(nvcc, src, out_dir / (src.stem + ".fatbin"), archs),
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
                 for src in batch]
        for src, proc in procs:
            log = proc.communicate()[0]
            if proc.returncode:
                raise KernelSourceError("nvcc failed on %s:\n%s" % (src.name, log[-4000:]))
            outputs.append(out_dir / (src.stem + ".fatbin"))
    write_signatures(out_dir)
    return outputs


if __name__ == "__main__":
    # python pycaffe_dist/backend/kernel_source.py [host|gpu]: rebuild without reinstalling the package.
    which = sys.argv[1:] or ["host"]
    if "host" in which:
        print(build_host_library())
    if "gpu" in which:
        print("\n".join(str(p) for p in build_fatbins()))
