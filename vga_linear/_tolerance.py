"""The op's accuracy contract, in one place: ``atol = rtol`` per dtype against a float64 reference.

KernelBench's tolerances: fp32 at "highest" matmul precision 1e-4, the half types 1e-2; float64
(the reference's own dtype) 1e-10. The tests (tests/utils.py), the benchmarks
(benchmarks/metrics.py) and the sanitizer workload (tools/sanitizer_workload.py) read them here.
"""

import torch

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def tolerance(dtype: torch.dtype) -> float:
    """``atol = rtol`` for outputs of ``dtype``."""
    return TOLERANCE[dtype]
