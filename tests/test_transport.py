"""Publisher -> 2 Subscribers over gloo on loopback (spawned processes): bit-exact over Adam-like steps,
digest-mismatch repair, resync of a receiver that lost sync, and the sync=full baseline."""
import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from searchr1.config import SyncConfig

SHAPES = {"embed.weight": (600, 1000), "layers.0.q.weight": (64, 64), "layers.0.norm.weight": (64,),
          "lm_head.weight": (32, 64)}


def _trainer_weights(step: int) -> dict[str, torch.Tensor]:
    """The same deterministic Adam-like trajectory in every process, so receivers know the expected bits."""
    g = torch.Generator().manual_seed(0)
    master = {k: torch.randn(s, generator=g) * 0.02 for k, s in SHAPES.items()}
    master["layers.0.norm.weight"] += 1.0
    for _ in range(step):
        for p in master.values():
            p.sub_(1e-5 * torch.randn(p.shape, generator=g).sign())
    return {k: p.bfloat16().contiguous() for k, p in master.items()}


def _worker(rank: int, world: int, port: int, method: str, steps: int, q):
    from searchr1.weightsync.transport import Publisher, Subscriber

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    group = dist.new_group(list(range(world)))
    cfg = SyncConfig(method=method, bucket_mb=1, verify=True)
    out = []
    try:
        if rank == 0:
            pub = Publisher(group, cfg, "cpu")
            for step in range(steps):
                out.append(pub.publish(_trainer_weights(step), version=step))
        else:
            sub = Subscriber(group, cfg, "cpu")
            views = {k: torch.zeros(s, dtype=torch.bfloat16) for k, s in SHAPES.items()}
            for step in range(steps):
                if rank == 1 and step == 3:
                    views["embed.weight"][7, 9] = float("nan")  # corrupt a receiver: repaired within step 3
                if rank == 2 and step == 5:
                    sub.synced = False  # as if this rank restarted: the publication becomes a full export
                m = sub.receive(views)
                want = _trainer_weights(step)
                for k in SHAPES:
                    assert torch.equal(views[k].view(torch.int16), want[k].view(torch.int16)), (rank, step, k)
                out.append(m)
    finally:
        dist.destroy_process_group()
    q.put((rank, out))


def _run(method: str, steps: int) -> dict[int, list[dict]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.spawn(_worker, args=(3, port, method, steps, q), nprocs=3, join=True)
    return dict(q.get() for _ in range(3))


def test_delta_publication_two_receivers_repair_and_resync():
    res = _run("delta", 7)
    pub = res[0]
    assert [m["sync/full"] for m in pub] == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert all(m["sync/verified"] == 1.0 for m in pub)
    assert pub[3]["sync/mismatched"] == 1.0 and pub[3]["sync/repaired"] == 1.0
    assert res[1][3]["sync/repaired"] == 1.0 and res[2][3]["sync/repaired"] == 0.0
    assert sum(m["sync/repaired"] for i, m in enumerate(pub) if i != 3) == 0
    total = sum(math.prod(s) for s in SHAPES.values())
    for m in pub[1:3] + pub[4:5]:
        assert 0 < m["sync/changed"] < total
        assert m["sync/bytes_frac"] < 0.6  # ~3 bytes per change vs 2 per element, plus fixed headers
        assert m["sync/changed_frac"] == m["sync/changed"] / total
    assert pub[0]["sync/bytes"] >= 2 * total and pub[0]["sync/frames"] >= 2  # 1 MB buckets
    assert [m["sync/version"] for m in res[2]] == list(range(7))


def test_full_method_sends_everything_each_time():
    res = _run("full", 2)
    total = sum(math.prod(s) for s in SHAPES.values())
    for m in res[0]:
        assert m["sync/tensors_full"] == len(SHAPES) and m["sync/changed"] == total
        assert m["sync/bytes"] >= 2 * total
    assert res[0][1]["sync/full"] == 1.0
