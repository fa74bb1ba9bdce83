"""Part 6: GPU kernels with Numba-CUDA, and the same operations on the CPU with numba.njit.

    import course.kernels as K          # import it before anything that imports numba.cuda
    K.backend()                         # "gpu" on a machine with one, else "simulator"
    K.vector_add(a, b); K.reduce_sum(x); K.softmax(x); K.layer_norm(x, w, b)
    K.matmul(a, b, method="tiled")      # or "naive", "thread_tile", "register"
    K.matmul_into(a, b, out)            # batched, on device arrays, the fastest kernel by default
    K.selective_scan(u, delta, A, B, C, D)
    K.cpu.matmul(a, b)                  # the CPU twins (numba.njit, on several threads)
    K.fused_cuda.attention(q, k, v)     # lesson 6.5: attention by tiles (and its backward), cross-entropy
    K.fused.attention(q, k, v)          # and their CPU twins, fused autograd operations
    with K.use_kernels("cpu"):          # or "cuda": GPT and Mamba run on the kernels
        logits, loss = model(x, y)
    K.launches()                        # {kernel name: launches} since reset_launches()
    t = tensor.to("cuda")               # tensors that live on the GPU (course.kernels.device):
    model.to("cuda")                    # every operation a kernel, nothing copied but what you ask
    K.transfers()                       # host <-> device copies since reset_transfers()
    report = K.trace(kernel, griddim, blockdim, *args)   # who touched what; races; missing guards;
                                        # unwritten shared memory, partial barriers, warp misuse;
                                        # per-thread counts, bank conflicts, transactions
    from course.kernels import compile   # compile.compile_ptx(kernel, args): PTX for real GPUs (NVVM)

Importing this package chooses where CUDA kernels run (`_backend`): a real GPU when numba can
use one, else Numba's CUDA simulator, which runs every GPU thread as a Python thread on the CPU:
slow (keep sizes small) but faithful, and it runs anywhere.
"""

from ._backend import backend, backend_reason, cuda  # first: it must run before numba.cuda is imported
from . import cpu, fused, fused_cuda, ops
from .device import CudaArray, reset_transfers, transfers
from .fused_cuda import attention_kernel, cross_entropy_backward_kernel, cross_entropy_forward_kernel
from .basics import add_row, reduce_rows, reduce_sum, reduce_sum_kernel, vector_add, vector_add_kernel
from .launch import (MAX_THREADS_PER_BLOCK, THREADS_PER_BLOCK, check_launch, launch, launches,
                     reset_launches)
from .matmul import (TILE, matmul, matmul_into, matmul_naive_kernel, matmul_register_kernel,
                     matmul_thread_tile_kernel, matmul_tiled_kernel)
from .ops import DEVICES, use_kernels
from .rows import (layer_norm, layer_norm_backward, layer_norm_kernel, softmax, softmax_backward,
                   softmax_kernel)
from .scan import MAX_STATE, selective_scan, selective_scan_backward, selective_scan_kernel
from .trace import TraceReport, trace

__all__ = ["backend", "backend_reason", "cuda", "cpu", "fused", "fused_cuda", "ops", "CudaArray", "transfers",
           "reset_transfers", "attention_kernel", "cross_entropy_forward_kernel", "cross_entropy_backward_kernel",
           "use_kernels", "DEVICES",
           "vector_add", "reduce_sum", "reduce_rows", "add_row", "softmax", "softmax_backward",
           "layer_norm", "layer_norm_backward", "matmul", "matmul_into", "selective_scan", "selective_scan_backward",
           "vector_add_kernel", "reduce_sum_kernel", "softmax_kernel", "layer_norm_kernel",
           "matmul_naive_kernel", "matmul_tiled_kernel", "matmul_thread_tile_kernel",
           "matmul_register_kernel", "selective_scan_kernel",
           "launch", "check_launch", "launches", "reset_launches", "trace", "TraceReport",
           "MAX_THREADS_PER_BLOCK", "THREADS_PER_BLOCK", "TILE", "MAX_STATE"]
