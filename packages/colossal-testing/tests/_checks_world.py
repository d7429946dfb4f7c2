import torch
import torch.distributed as dist


def rank_sum() -> int:
    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    return int(t.item())


def fail_on_rank_one() -> int:
    if dist.get_rank() == 1:
        raise ValueError("boom on one")
    return dist.get_rank()
