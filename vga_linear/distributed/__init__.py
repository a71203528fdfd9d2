"""Tensor-parallel ``all_gather`` on the hidden dim fused with the linear, on torch.distributed.

``all_gather_linear(x_local, weight, bias, group)`` is ``F.linear(torch.cat(all_gather(x_local), -1),
weight, bias)`` on every rank, by one of two strategies (``"gather"``: all_gather, then the fused
op; ``"row_parallel"``: each rank's column block, then a reduction) that ``strategy="auto"``
chooses with a cost model; :class:`AllGatherLinear` is its module. How each strategy works, what
the cost model prices, the autograd modes and torch.compile: docs/distributed.md.

Files, by role: collectives (the torch.distributed calls), strategies (forward and backward of
each strategy), ops (the ``vga_dist`` custom ops and their autograd), cost_model (machine numbers,
calibration), planner (estimates and the choice), api (the functions and the module below).
"""

from .api import AllGatherLinear, all_gather_linear, last_plan
from .cost_model import CostModel, calibrate, default_cost_model, set_cost_model
from .planner import STRATEGIES, Estimate, Plan, plan_all_gather_linear
from .strategies import chunk_bounds

__all__ = [
    "all_gather_linear",
    "plan_all_gather_linear",
    "last_plan",
    "AllGatherLinear",
    "CostModel",
    "Estimate",
    "Plan",
    "default_cost_model",
    "set_cost_model",
    "calibrate",
    "chunk_bounds",
    "STRATEGIES",
]
