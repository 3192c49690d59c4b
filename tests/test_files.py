"""The file channel of elastic rollouts: publications as files, bit-exact replay, joins from a full file, a
corrupted file survived by rejoining, old files pruned."""
import torch

from searchr1.config import SyncConfig
from searchr1.weightsync.files import FilePublisher, FileSubscriber, publications

SHAPES = {"embed.weight": (300, 64), "layers.0.q.weight": (64, 64), "norm.weight": (64,)}


def weights(step):
    g = torch.Generator().manual_seed(0)
    master = {k: torch.randn(s, generator=g) * 0.02 for k, s in SHAPES.items()}
    for _ in range(step):  # a few percent of the elements move by a bf16 step or more, as after an Adam update
        for p in master.values():
            p.sub_(1e-3 * (torch.rand(p.shape, generator=g) < 0.03))
    return {k: p.bfloat16().contiguous() for k, p in master.items()}


def same(views, step):
    want = weights(step)
    return all(torch.equal(views[k].view(torch.int16), want[k].view(torch.int16)) for k in SHAPES)


def zeros():
    return {k: torch.zeros(s, dtype=torch.bfloat16) for k, s in SHAPES.items()}


def test_follow_join_and_prune(tmp_path):
    cfg = SyncConfig(bucket_mb=1)
    pub = FilePublisher(tmp_path, cfg, full_every=3)
    follower, views = FileSubscriber(tmp_path, cfg), zeros()
    sizes = {}
    for v in range(5):
        m = pub.publish(weights(v), v)
        sizes[v] = m["sync/bytes"]
        got = follower.catch_up(views, v)
        assert same(views, v) and got["sync/joined"] == (1.0 if v == 0 else 0.0)
    assert [(v, k) for v, k, _ in publications(tmp_path / "weights")] == [
        (0, "full"), (1, "delta"), (2, "delta"), (3, "full"), (4, "delta")]
    assert sizes[1] < sizes[0] / 2 and follower.joins == 1
    joiner, late = FileSubscriber(tmp_path, cfg), zeros()
    joiner.catch_up(late, 4)  # the newest full (v3) and the delta after it
    assert same(late, 4) and joiner.joins == 1
    for v in range(5, 10):
        pub.publish(weights(v), v)
    assert [v for v, _, _ in publications(tmp_path / "weights")][0] == 6  # before the second-newest full: gone
    follower.catch_up(views, 9)
    assert same(views, 9)


def test_a_corrupted_file_is_refused_and_the_next_full_one_rejoins(tmp_path):
    import pytest

    from searchr1.weightsync.transport import SyncError

    cfg = SyncConfig(bucket_mb=1)
    pub = FilePublisher(tmp_path, cfg, full_every=2)
    sub, views = FileSubscriber(tmp_path, cfg), zeros()
    for v in range(4):
        pub.publish(weights(v), v)
    sub.catch_up(views, 2)
    path = tmp_path / "weights" / "v000003.delta"
    data = bytearray(path.read_bytes())
    for i in range(len(data) - 200, len(data) - 100):  # bytes flipped inside the last frame's payload
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    with pytest.raises(SyncError):
        sub.catch_up(views, 3)  # fails its digests, and again after rejoining from v2: never served
    pub.publish(weights(4), 4)  # the next full publication
    got = sub.catch_up(views, 4)
    assert same(views, 4) and got["sync/joined"] == 1.0
