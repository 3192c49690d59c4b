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
    assert [(v, k) for v, k, _ in publications(pub.folder)] == [
        (0, "full"), (1, "delta"), (2, "delta"), (3, "full"), (4, "delta")]
    assert sizes[1] < sizes[0] / 2 and follower.joins == 1
    joiner, late = FileSubscriber(tmp_path, cfg), zeros()
    joiner.catch_up(late, 4)  # the newest full (v3) and the delta after it
    assert same(late, 4) and joiner.joins == 1
    for v in range(5, 10):
        pub.publish(weights(v), v)
    assert [v for v, _, _ in publications(pub.folder)][0] == 6  # before the second-newest full: gone
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
    path = pub.folder / "v000003.delta"
    data = bytearray(path.read_bytes())
    for i in range(len(data) - 200, len(data) - 100):  # bytes flipped inside the last frame's payload
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    with pytest.raises(SyncError):
        sub.catch_up(views, 3)  # fails its digests, and again after rejoining from v2: never served
    pub.publish(weights(4), 4)  # the next full publication
    got = sub.catch_up(views, 4)
    assert same(views, 4) and got["sync/joined"] == 1.0


def other_run(step):
    """The weights of another incarnation at the same version numbers (a requeued or resumed job)."""
    return weights(step + 100)


def test_a_requeued_publisher_never_mixes_its_files_with_the_old_ones(tmp_path):
    """Issue 26, finding 1: a stop after step 37 and a requeue anchored the new full at 37 beside the old run's
    v37 delta; the delta sorted first and every worker failed for ever."""
    cfg = SyncConfig(bucket_mb=1)
    old = FilePublisher(tmp_path, cfg, full_every=10)
    for v in range(30, 38):
        old.publish(weights(v), v)
    new = FilePublisher(tmp_path, cfg, full_every=10)  # the requeued job resumes at its checkpoint of step 37
    new.publish(other_run(37), 37)
    new.publish(other_run(38), 38)
    sub, views = FileSubscriber(tmp_path, cfg), zeros()
    sub.catch_up(views, 38)
    assert same(views, 138)
    assert [p.name for p in (tmp_path / "weights").iterdir() if p.is_dir()] == [new.folder.name]  # old files gone


def test_a_resume_from_an_older_checkpoint_is_not_pruned_by_the_old_run_s_newer_files(tmp_path):
    """Finding 1, second variant: the old run reached v50, the new one resumes at 25; the old v40/v50 fulls
    looked newest and pruning deleted the new v25 full."""
    cfg = SyncConfig(bucket_mb=1)
    old = FilePublisher(tmp_path, cfg, full_every=10)
    for v in range(40, 51):
        old.publish(weights(v), v)
    new = FilePublisher(tmp_path, cfg, full_every=10)
    for v in range(25, 28):
        new.publish(other_run(v), v)
    assert [(v, k) for v, k, _ in publications(new.folder)] == [(25, "full"), (26, "delta"), (27, "delta")]
    sub, views = FileSubscriber(tmp_path, cfg), zeros()
    sub.catch_up(views, 27)
    assert same(views, 127)


def test_a_worker_of_the_old_incarnation_rejoins_from_the_new_one(tmp_path):
    """Finding 1, third variant: a worker at v39 applied the new run's v40 delta and then the old v40 full,
    which passed its own digests: generation under "version 40" with the old run's weights."""
    cfg = SyncConfig(bucket_mb=1)
    old = FilePublisher(tmp_path, cfg, full_every=10)
    sub, views = FileSubscriber(tmp_path, cfg), zeros()
    for v in range(30, 40):
        old.publish(weights(v), v)
    sub.catch_up(views, 39)
    new = FilePublisher(tmp_path, cfg, full_every=10)
    new.publish(other_run(40), 40)
    got = sub.catch_up(views, 40)
    assert same(views, 140) and got["sync/joined"] == 1.0


def test_an_older_version_is_rebuilt_when_a_worker_holds_a_newer_one(tmp_path):
    """Finding 2: a worker holding v11 that took a re-issued evaluation of v10 did nothing to reach v10 and
    evaluated v11's weights under v10's label."""
    cfg = SyncConfig(bucket_mb=1)
    pub = FilePublisher(tmp_path, cfg, full_every=5)
    sub, views = FileSubscriber(tmp_path, cfg), zeros()
    for v in range(12):
        pub.publish(weights(v), v)
    sub.catch_up(views, 11)
    sub.catch_up(views, 10)
    assert same(views, 10) and sub.applied == 10
