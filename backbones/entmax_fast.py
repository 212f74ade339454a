"""Fast exact entmax-1.5 and sparsemax for attention: ``entmax15(scores, dim=-1)``, ``sparsemax(scores, dim=-1)``.
Same values and gradients as ``entmax.entmax15`` / ``entmax.sparsemax`` (to float rounding), without their full
sort: Newton steps from below (so {z > tau} contains the support), finished by the closed-form root on that
support when consistent (then exact); unsettled rows use the sort-based formula. The backward saves only Y;
:func:`sparse_attention` saves q, k, v and 2 numbers per row instead.

``backend`` (``create_vit(..., entmax_backend=...)``): ``cpp`` = backbones/csrc/entmax_fast.cpp, built at first use
(``-O3 -march=native``, cached under ``~/.cache/tokenmix``); ``torch``: the same in PyTorch, any device; ``auto``:
``cpp`` for CPU tensors when it builds. fp16/bf16 inputs are computed in fp32 and return fp32.
"""
from __future__ import annotations

import ctypes
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

__all__ = ["entmax15", "sparsemax", "sparse_attention", "cpp_available", "cpp_build_error", "BACKENDS",
           "DEFAULT_BACKEND"]

BACKENDS = ("auto", "cpp", "torch")
DEFAULT_BACKEND = "auto"
_SRC = Path(__file__).resolve().with_name("csrc") / "entmax_fast.cpp"
# no errno and no FP traps: lets sqrt and the masked reductions vectorise (IEEE results unchanged)
_CXXFLAGS = ["-O3", "-std=c++17", "-fPIC", "-shared", "-fopenmp", "-fno-math-errno", "-fno-trapping-math"]
_MAX_SWEEPS = 64


def _check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"unknown entmax backend '{name}'; valid: {', '.join(BACKENDS)}")
    return name


# ----------------------------------------------------------------------------------------------- C++ build
_lib: ctypes.CDLL | None = None
_lib_error: str | None = None
_lib_lock = threading.Lock()
_warned = False


def _cpu_features() -> str:
    # -march=native code is only valid on the CPU it was built for: the cache key includes its features.
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_dir() -> Path:
    root = os.environ.get("TOKENMIX_EXT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tokenmix", "ext")
    return Path(root)


def _compile(cxx: str, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    # -march=native first (AVX-512/AVX2/NEON as the CPU offers); plain -O3 if the compiler refuses it.
    for arch in (["-march=native"], []):
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        os.close(fd)
        cmd = [cxx, *_CXXFLAGS, *arch, str(_SRC), "-o", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode == 0:
            os.replace(tmp, out)  # atomic: parallel test workers never load a half-written library
            return
        os.unlink(tmp)
        errors.append(f"$ {' '.join(cmd)}\n{proc.stderr.strip()[-2000:]}")
    raise RuntimeError("\n".join(errors))


def _load() -> ctypes.CDLL | None:
    global _lib, _lib_error
    if _lib is not None or _lib_error is not None:
        return _lib
    with _lib_lock:
        if _lib is not None or _lib_error is not None:
            return _lib
        try:
            cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
            if cxx is None:
                raise RuntimeError("no C++ compiler found (install g++ or set CXX)")
            version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
            key = hashlib.sha256("\0".join([_SRC.read_text(), " ".join(_CXXFLAGS), version,
                                            _cpu_features()]).encode()).hexdigest()[:16]
            path = _cache_dir() / f"entmax_fast_{key}.so"
            if not path.is_file():
                _compile(cxx, path)
            lib = ctypes.CDLL(str(path))
            ptr, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
            for suf in ("f32", "f64"):
                for name in ("entmax15", "sparsemax"):
                    for op in ("fwd", "apply", "bwd"):  # (in, out/stats, out, rows, n, threads)
                        getattr(lib, f"tm_{name}_{op}_{suf}").argtypes = [ptr, ptr, ptr, i64, i64, i32]
            lib.tm_set_max_sweeps.argtypes = [i32]
            _lib = lib
        except Exception as e:  # any failure: keep the exact PyTorch path
            _lib_error = f"{type(e).__name__}: {e}"
    return _lib


def cpp_available() -> bool:
    """Builds (once, cached) and loads the C++ kernel; False when that is impossible here."""
    return _load() is not None


def cpp_build_error() -> str | None:
    _load()
    return _lib_error


_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


def _use_cpp(x: torch.Tensor, backend: str) -> bool:
    global _warned
    if _check_backend(backend) == "torch":
        return False
    eligible = x.device.type == "cpu" and x.dtype in _SUFFIX
    if backend == "cpp":
        if not eligible:
            raise RuntimeError(f"entmax backend 'cpp' needs a CPU float32/float64 tensor, got {x.device} {x.dtype}")
        if _load() is None:
            raise RuntimeError(f"entmax backend 'cpp' unavailable: the C++ kernel did not build:\n{_lib_error}")
        return True
    if not eligible:
        return False
    if _load() is None:
        if not _warned:
            _warned = True
            warnings.warn("backbones.entmax_fast: C++ kernel unavailable, using the exact (slower) PyTorch "
                          f"path. Reason: {_lib_error}", RuntimeWarning, stacklevel=4)
        return False
    return True


def _cpp_call(op: str, *tensors: torch.Tensor | None) -> None:
    """tensors[0]: (rows, n) contiguous; None passes a null pointer (no row statistics wanted)."""
    rows, n = tensors[0].shape
    fn = getattr(_lib, f"tm_{op}_{_SUFFIX[tensors[0].dtype]}")
    fn(*(ctypes.c_void_p(None if t is None else t.data_ptr()) for t in tensors), rows, n, torch.get_num_threads())


# ------------------------------------------------------------------------------------------- PyTorch path
def _threshold_sorted(z: torch.Tensor, entmax15: bool) -> torch.Tensor:
    """Sort-based exact threshold (entmax's formula), for the rare rows the sweep does not settle."""
    zs = z.sort(dim=-1, descending=True).values
    k = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    s1 = zs.cumsum(-1)
    if entmax15:
        mean = s1 / k
        ss = (zs * zs).cumsum(-1) - s1 * mean
        cand = mean - ((1 - ss) / k).clamp_min(0).sqrt()
    else:
        cand = (s1 - 1) / k
    support = ((cand <= zs) & (zs > float("-inf"))).sum(-1, keepdim=True).clamp_min(1)  # -inf: masked keys
    return cand.gather(-1, support - 1)


def _threshold_torch(z: torch.Tensor, entmax15: bool) -> torch.Tensor:
    """Exact tau per row of z (rows have max 0 or are all NaN). Same algorithm as the C++ kernel, arranged
    for few full-tensor passes: d = (z - t)_+ gives k, sum d, ||d|| (Newton and closed form alike); the
    closed-form root u on S = {d > 0} is exact iff no member of S lies at or below it, i.e.
    #{d > u} == #{d > 0} (non-members have d <= 0 <= u since t never passes tau)."""
    rows = z.shape[0]
    tau = torch.full((rows, 1), float("nan"), device=z.device, dtype=z.dtype)
    active = torch.nonzero(~torch.isnan(z[:, 0])).squeeze(1)  # all-masked rows stay NaN
    z_a = z if active.numel() == rows else z[active]
    t_a = torch.full((active.numel(), 1), -1.0, device=z.device, dtype=z.dtype)
    # Plain Newton steps first (no check: 5 passes each); at ViT init most rows settle after ~3.
    for sweep in range(_MAX_SWEEPS):
        if active.numel() == 0:
            return tau
        d = (z_a - t_a).clamp_(min=0)
        s1 = d.sum(-1, keepdim=True)
        if entmax15:
            norm = torch.linalg.vector_norm(d, dim=-1, keepdim=True)
            step = (norm * norm - norm) / s1
        if sweep < (2 if entmax15 else 1):
            t_a = t_a + step if entmax15 else t_a + (s1 - 1) / torch.count_nonzero(d, dim=-1).unsqueeze(-1)
            continue
        k = torch.count_nonzero(d, dim=-1).unsqueeze(-1)  # d >= 0 after the clamp: one pass, no mask
        if entmax15:
            mean = s1 / k
            u = mean - ((1 - (norm * norm - s1 * mean)) / k).clamp_min(0).sqrt()
        else:
            u = (s1 - 1) / k
            step = u
        ok = (torch.count_nonzero(d > u, dim=-1) == k.squeeze(1)) & (u >= 0).squeeze(1)
        tau[active[ok]] = (t_a + u)[ok]
        stuck = ~ok & ~(torch.isfinite(step) & (step > 0)).squeeze(1)
        if stuck.any():  # no progress left in floating point: exact sort-based finish
            tau[active[stuck]] = _threshold_sorted(z_a[stuck], entmax15)
        keep = ~ok & ~stuck
        if keep.all():
            t_a = t_a + step
        else:
            active, z_a, t_a = active[keep], z_a[keep], (t_a + step)[keep]
    if active.numel():
        tau[active] = _threshold_sorted(z_a, entmax15)
    return tau


def _forward_torch(x: torch.Tensor, entmax15: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(Y, mt) with mt[:, 0] = row max, mt[:, 1] = tau in z space: what :func:`_apply_torch` needs."""
    m = x.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, float("nan"))  # all -inf / +inf rows -> NaN, like softmax
    z = x - m
    if entmax15:
        z.mul_(0.5)
    tau = _threshold_torch(z, entmax15)
    y = z.sub_(tau).clamp_(min=0)
    return (y.square_() if entmax15 else y), torch.cat([m, tau], dim=1)


def _apply_torch(x: torch.Tensor, mt: torch.Tensor, entmax15: bool) -> torch.Tensor:
    """Y from the logits and saved row statistics, with the forward's exact arithmetic (same bits)."""
    z = x - mt[:, :1]
    if entmax15:
        z.mul_(0.5)
    y = z.sub_(mt[:, 1:]).clamp_(min=0)
    return y.square_() if entmax15 else y


def _backward_torch(y: torch.Tensor, dy: torch.Tensor, entmax15: bool) -> torch.Tensor:
    g = y.sqrt() if entmax15 else (y > 0).to(y.dtype)
    dx = dy * g
    q = dx.sum(-1, keepdim=True) / g.sum(-1, keepdim=True)
    return dx.sub_(q * g)


# -------------------------------------------------------------------------------------------------- autograd
class _SparseNormFn(torch.autograd.Function):
    """x: (rows, n) contiguous float32/float64. Saves only the output for the backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, entmax15: bool, cpp: bool) -> torch.Tensor:
        if cpp:
            y = torch.empty_like(x)
            _cpp_call("entmax15_fwd" if entmax15 else "sparsemax_fwd", x, y, None)
        else:
            y, _ = _forward_torch(x, entmax15)
        ctx.entmax15, ctx.cpp = entmax15, cpp
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (y,) = ctx.saved_tensors
        dy = dy.contiguous()
        if ctx.cpp:
            dx = torch.empty_like(y)
            _cpp_call("entmax15_bwd" if ctx.entmax15 else "sparsemax_bwd", y, dy, dx)
        else:
            dx = _backward_torch(y, dy, ctx.entmax15)
        return dx, None, None


def _recompute(s2: torch.Tensor, mt: torch.Tensor, entmax15: bool, cpp: bool) -> None:
    if cpp:
        _cpp_call("entmax15_apply" if entmax15 else "sparsemax_apply", s2, mt, s2)
    else:
        s2.copy_(_apply_torch(s2, mt, entmax15))


def _scaled_mm(a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """``(a @ b) * scale``, contiguous. A power-of-two scale (1/8 for head dim 64) is exact, so it is applied
    inside the batched GEMM (``alpha``) with the same bits and without a pass over the (.., N, M) result."""
    if a.shape[:-2] != b.shape[:-2] or a.dim() < 3 or math.frexp(scale)[0] != 0.5:
        return torch.matmul(a, b).mul_(scale)
    a3, b3 = a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:])
    return torch.baddbmm(a3.new_zeros(1, 1, 1), a3, b3, beta=0, alpha=scale).view(*a.shape[:-1], b.shape[-1])


def _logits(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    # DINO's order, (q @ k^T) * scale, in fp32 whatever the input dtype; contiguous (B, H, N, M)
    dt = q.dtype if q.dtype in _SUFFIX else torch.float32
    return _scaled_mm(q.to(dt), k.to(dt).transpose(-2, -1), scale)


def _attention_forward(q, k, v, scale: float, entmax15: bool, backend: str):
    """(output, the (rows, 2) statistics that recompute Y, whether the C++ kernel ran): the forward of both the
    autograd function and the ``torch.compile`` custom op (backbones/compile_ops.py)."""
    s = _logits(q, k, scale)
    s2 = s.view(-1, s.shape[-1])  # Y replaces the logits in place
    cpp = _use_cpp(s2, backend)
    if cpp:
        mt = s2.new_empty(s2.shape[0], 2)
        _cpp_call("entmax15_fwd" if entmax15 else "sparsemax_fwd", s2, s2, mt)
    else:
        y, mt = _forward_torch(s2, entmax15)
        s2.copy_(y)
    return torch.matmul(s, v.to(s.dtype)), mt, cpp


class _SparseAttentionFn(torch.autograd.Function):
    """out = normaliser(q k^T * scale) v, saving q, k, v and 2 numbers per row instead of the (N x M)
    probabilities: the backward recomputes them (one extra q k^T, as flash attention does) bit for bit."""

    @staticmethod
    def forward(ctx, q, k, v, scale: float, entmax15: bool, backend: str):
        q, k, v = (t.contiguous() for t in (q, k, v))  # views of one qkv: copy once here, not in every matmul
        out, mt, cpp = _attention_forward(q, k, v, scale, entmax15, backend)
        ctx.save_for_backward(q, k, v, mt)
        ctx.scale, ctx.entmax15, ctx.cpp = scale, entmax15, cpp
        return out

    @staticmethod
    def backward(ctx, dout):
        with torch.autocast(device_type=dout.device.type, enabled=False):  # also when backward() runs under it
            return _SparseAttentionFn._backward(ctx, dout)

    @staticmethod
    def _backward(ctx, dout):
        q, k, v, mt = ctx.saved_tensors
        y = _logits(q, k, ctx.scale)
        y2 = y.view(-1, y.shape[-1])
        _recompute(y2, mt, ctx.entmax15, ctx.cpp)
        dout = dout.to(y.dtype).contiguous()  # usually a transposed view: one copy for both matmuls below
        dv = torch.matmul(y.transpose(-2, -1), dout)
        ds = torch.matmul(dout, v.to(y.dtype).transpose(-2, -1)).contiguous()
        ds2 = ds.view(-1, ds.shape[-1])
        if ctx.cpp:
            _cpp_call("entmax15_bwd" if ctx.entmax15 else "sparsemax_bwd", y2, ds2, ds2)
        else:
            ds2.copy_(_backward_torch(y2, ds2, ctx.entmax15))
        del y, y2
        exact = math.frexp(ctx.scale)[0] == 0.5  # a power of two goes into the GEMMs (_scaled_mm)
        if not exact:
            ds.mul_(ctx.scale)  # any other scale: scaled first, the earlier order, same bits
        dq = _scaled_mm(ds, k.to(ds.dtype), ctx.scale if exact else 1.0)
        dk = _scaled_mm(ds.transpose(-2, -1), q.to(ds.dtype), ctx.scale if exact else 1.0)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     kind: str = "entmax15", backend: str = DEFAULT_BACKEND) -> torch.Tensor:
    """``normaliser((q @ k^T) * scale) @ v`` for q (..., N, d), k (..., M, d), v (..., M, dv), normaliser entmax-1.5
    or sparsemax over the keys. Same values and gradients as the unfused lines, but the backward keeps only q, k,
    v and two numbers per row (the probabilities are recomputed exactly). fp32 throughout (fp64 stays fp64); no
    mask, no attention dropout."""
    if kind not in ("entmax15", "sparsemax"):
        raise ValueError(f"sparse_attention kind must be 'entmax15' or 'sparsemax', got '{kind}'")
    if q.dim() < 2 or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"sparse_attention expects q (..., N, d), k (..., M, d), v (..., M, dv); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    with torch.autocast(device_type=q.device.type, enabled=False):  # autocast would run the matmuls in bf16
        return _SparseAttentionFn.apply(q, k, v, float(scale), kind == "entmax15", backend)


def _apply(scores: torch.Tensor, dim: int, entmax15: bool, backend: str) -> torch.Tensor:
    if not torch.is_floating_point(scores):
        raise TypeError(f"{'entmax15' if entmax15 else 'sparsemax'} expects floating-point scores, got {scores.dtype}")
    if scores.dim() == 0:
        raise ValueError("scores must have at least one dimension")
    x = scores if scores.dtype in _SUFFIX else scores.float()  # fp16/bf16 thresholds are ill-conditioned
    last = dim in (-1, x.dim() - 1)
    if not last:
        x = x.movedim(dim, -1)
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()  # attention logits from a matmul: already contiguous, no copy
    if x2.numel() == 0:
        y = x2.clone()
    else:
        y = _SparseNormFn.apply(x2, entmax15, _use_cpp(x2, backend))
    y = y.view(shape)
    return y if last else y.movedim(-1, dim)


def entmax15(scores: torch.Tensor, dim: int = -1, backend: str = DEFAULT_BACKEND) -> torch.Tensor:
    """Exact entmax-1.5 along ``dim`` (= ``entmax.entmax15``): Y = clamp(X/2 - tau, 0)^2, rows sum to 1.
    Masked entries may be -inf (they get exactly 0); a row with no finite entry gives NaN, like softmax."""
    return _apply(scores, dim, True, backend)


def sparsemax(scores: torch.Tensor, dim: int = -1, backend: str = DEFAULT_BACKEND) -> torch.Tensor:
    """Exact sparsemax along ``dim`` (= ``entmax.sparsemax``): Y = clamp(X - tau, 0), rows sum to 1."""
    return _apply(scores, dim, False, backend)
