"""Compiles a Triton kernel with Triton's real compiler for an NVIDIA architecture (no GPU needed)."""

import torch


def compile_for_gpu(fn, dtype, consts: dict, arch: int, ints=(), long_ptrs=(), int_ptrs=()):
    """``fn`` (a ``triton.jit`` function) compiled for ``sm_{arch}``: the arguments in ``consts`` as
    constexprs, those in ``ints`` as i32, ``long_ptrs`` as int64 pointers, ``int_ptrs`` as int32
    pointers and every other one as a pointer to ``dtype`` (float32 or float64)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fp = "*fp64" if dtype == torch.float64 else "*fp32"

    def kind(a):
        if a in consts:
            return "constexpr"
        return "i32" if a in ints else "*i64" if a in long_ptrs else "*i32" if a in int_ptrs else fp

    sig = {a: kind(a) for a in fn.arg_names}
    cx = {(fn.arg_names.index(k),): v for k, v in consts.items()}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cx), target=GPUTarget("cuda", arch, 32))
