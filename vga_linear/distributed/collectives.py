"""The torch.distributed calls the strategies make, and the process-group lookups.

The strategies reach the collectives through this module (passed in as ``comm``), so a caller
may hand them a stand-in with the same three functions: the tests record the schedule with one,
``benchmarks/bench_distributed.py`` times the compute alone with one that moves nothing.
"""

import torch.distributed as dist
from torch import Tensor


def all_gather(out: Tensor, inp: Tensor, group, async_op: bool):
    """``out`` (R*n, ...) = the ranks' ``inp`` (n, ...) in group-rank order."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=async_op)


def reduce_scatter(out: Tensor, inp: Tensor, group, async_op: bool):
    """``out`` (n, ...) = this rank's block of the sum over ranks of ``inp`` (R*n, ...)."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, group=group, async_op=async_op)


def all_reduce(t: Tensor, group, async_op: bool):
    """``t`` = the sum over ranks of ``t``, in place."""
    return dist.all_reduce(t, group=group, async_op=async_op)


def resolve_group(group_name: str):
    """The process group a custom op received by name."""
    from torch.distributed import distributed_c10d as c10d

    return c10d._resolve_process_group(group_name)


def group_info(group):
    """(group, world size, this rank, group name); ``None`` is the default group."""
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    return group, dist.get_world_size(group), dist.get_rank(group), group.group_name
