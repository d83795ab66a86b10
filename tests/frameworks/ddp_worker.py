"""One rank of tests/frameworks/test_torch_models.py's DistributedDataParallel run.

    python ddp_worker.py RANK WORLD_SIZE PORT STEPS OUT

Trains examples/torch_mlp.py's MLP (opforge ops, float64) on this rank's shard of the spirals
with gloo over localhost, then rank 0 saves the parameters to OUT.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "examples"))
from torch_mlp import MLP, loss_fn, spirals  # noqa: E402


def main() -> int:
    rank, world, port, steps, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    x, labels = spirals(32, dtype=torch.float64)
    model = torch.nn.parallel.DistributedDataParallel(MLP(2, 16, 3, dtype=torch.float64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        loss = loss_fn(model, x[rank::world], labels[rank::world])
        opt.zero_grad()
        loss.backward()  # DDP averages the gradients of the ranks' shards
        opt.step()
    if rank == 0:
        torch.save({k: v.detach() for k, v in model.module.state_dict().items()}, out)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
