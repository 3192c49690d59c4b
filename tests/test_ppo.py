"""PPO with a critic: GAE and the clipped value loss against hand-computed cases; several updates per batch
make the clip act (PPO, and the decoupled objective as AReaL has it); the critic is trained, checkpointed,
resumed exactly, kept equal on DDP replicas and never published with the policy."""
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tests.test_learner import _free_port, flat_params, learner, make_trajs, metrics

from searchr1 import checkpoint
from searchr1.algos.ppo import gae, value_loss
from searchr1.batching import collate
from searchr1.config import AlgoConfig
from searchr1.metrics import read_metrics

# ---------------------------------------------------------------- GAE, by hand


def test_gae_terminal_reward_only():
    v = torch.tensor([[0.5, 0.2, 0.1]])
    adv, ret = gae(v, torch.tensor([1.0]), torch.ones(1, 3), gamma=0.9, lam=0.8)
    # delta_2 = 1 - 0.1 = 0.9; delta_1 = 0.9*0.1 - 0.2 = -0.11; delta_0 = 0.9*0.2 - 0.5 = -0.32
    # A_2 = 0.9; A_1 = -0.11 + 0.72*0.9 = 0.538; A_0 = -0.32 + 0.72*0.538 = 0.06736
    assert adv[0].tolist() == pytest.approx([0.06736, 0.538, 0.9], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([0.56736, 0.738, 1.0], abs=1e-6)
    # gamma = lambda = 1 (Search-R1's): every token's advantage is the reward minus its own value
    adv, ret = gae(v, torch.tensor([1.0]), torch.ones(1, 3), gamma=1.0, lam=1.0)
    assert adv[0].tolist() == pytest.approx([0.5, 0.8, 0.9]) and ret[0].tolist() == pytest.approx([1.0] * 3)


def test_gae_steps_over_information_tokens_in_the_middle():
    """Retrieved tokens are the environment's: no advantage, no return, and the recursion links the policy's
    tokens on either side of them as if they were adjacent (their values, whatever they are, are never read)."""
    mask = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 9.0, -9.0, 0.1]])
    adv, ret = gae(v, torch.tensor([1.0]), mask, gamma=0.9, lam=0.8)
    # as the trajectory [0.5, 0.1]: A_1 = 1 - 0.1 = 0.9; A_0 = 0.9*0.1 - 0.5 + 0.72*0.9 = 0.238
    assert adv[0].tolist() == pytest.approx([0.238, 0.0, 0.0, 0.9], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([0.738, 0.0, 0.0, 1.0], abs=1e-6)


def test_gae_rows_of_different_lengths_are_independent():
    """A batch of a 3-token row, a 1-token row (padded) and an empty one: each row as it is alone."""
    v = torch.tensor([[0.5, 0.2, 0.1], [0.3, 7.0, 7.0], [4.0, 4.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    adv, ret = gae(v, torch.tensor([1.0, 0.0, 5.0]), mask, gamma=0.9, lam=0.8)
    alone, _ = gae(v[:1], torch.tensor([1.0]), mask[:1], gamma=0.9, lam=0.8)
    assert torch.equal(adv[0], alone[0])
    assert adv[1].tolist() == pytest.approx([-0.3, 0.0, 0.0]) and ret[1].tolist() == pytest.approx([0.0, 0, 0])
    assert adv[2].abs().sum() == 0 and ret[2].abs().sum() == 0  # nothing trained: the reward lands nowhere


def test_value_loss_clips_by_hand():
    values = torch.tensor([[1.0, 0.0, 0.9, 5.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.5, 0.0]])
    ret = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last: an information token, whatever its numbers
    loss, st = value_loss(values, old, ret, mask, clip=0.2, agg="token_mean")
    # tokens 0, 1: (V - R)^2 = 1 beats the clipped 0.49; token 2: V_clip = 0.7, (0.7 - 1)^2 = 0.09 beats 0.01
    assert loss.item() == pytest.approx((0.5 + 0.5 + 0.045) / 3)
    assert st["vf_clip_tokens"].item() == 1 and st["vf_err_sq"].item() == pytest.approx(2.01)
    loss.backward()
    # the clipped token gets no gradient (V left the trust region away from its target); d/dV = (V - R) / 3
    assert values.grad[0].tolist() == pytest.approx([1 / 3, -1 / 3, 0.0, 0.0])


# ---------------------------------------------------------------- on the tiny model


def on_policy(tr, trajs):
    """The trajectories with their behaviour log-probs set to the learner's own: the first update's ratio is 1."""
    mb = collate(trajs, torch.zeros(len(trajs)), tr.pad_id, "cpu")
    with torch.no_grad():
        logp_bt, _ = tr._logprobs(tr.scorer, mb)
    on_bt = mb["mask_bt"].bool()
    for i, t in enumerate(trajs):
        it = iter(logp_bt[i][on_bt[i]].tolist())
        t.logprobs = [next(it) if m else 0.0 for m in t.loss_mask]
    return trajs


@pytest.mark.parametrize("algo", [{"name": "ppo"}, {"name": "grpo", "off_policy": "decoupled"}],
                         ids=["ppo", "grpo_decoupled"])
def test_several_updates_per_batch_make_the_clip_act(algo):
    """One update per batch: the ratio is 1 at its only update, nothing is clipped. Four (two epochs of two
    minibatches): the policy has moved from the one that sampled (PPO) or from the proximal one (decoupled)
    by the later updates, and the clip acts."""
    one = learner(lr=3e-2, **algo)
    m1 = metrics(one.step(on_policy(one, make_trajs(5))))
    assert m1["clip_frac"] == 0 and "updates" not in m1
    four = learner(lr=3e-2, ppo_epochs=2, minibatches=2, **algo)
    m4 = metrics(four.step(on_policy(four, make_trajs(5))))
    assert m4["updates"] == 4 and m4["clip_frac"] > 0


def test_ppo_trains_the_critic_and_publishes_the_policy_only():
    tr = learner(name="ppo", lr=1e-3, critic_lr=1e-2, ppo_epochs=2)
    trajs = make_trajs(6)
    m = metrics(tr.step(trajs))
    assert m["value_mean"] == 0.0  # the head starts at zero
    assert m["return_mean"] == pytest.approx(sum(t.reward for t in trajs) / len(trajs), rel=0.3)
    assert tr.critic.linear.weight.abs().sum() > 0
    assert set(tr.bf16_weights()) == set(learner().bf16_weights())  # what the rollouts get: the policy's names
    m2 = metrics(tr.step(make_trajs(6)))
    assert m2["value_mean"] != 0.0 and m2["vf_loss"] < m["vf_loss"]


def test_ppo_kill_and_resume_is_bitwise(tmp_path):
    batches = [make_trajs(20 + s) for s in range(3)]
    kw = dict(name="ppo", lr=1e-3, ppo_epochs=2, minibatches=2)
    run = learner(**kw)
    run.step(batches[0])
    checkpoint.save(tmp_path, 1, run, {"step": 1}, keep=1)
    for trajs in batches[1:]:
        run.step(trajs)
    expected = flat_params(run), torch.cat([p.detach().reshape(-1) for p in run.critic.parameters()])

    resumed = learner(seed=1, **kw)
    checkpoint.load(checkpoint.latest(tmp_path), resumed)
    for trajs in batches[1:]:
        resumed.step(trajs)
    assert torch.equal(flat_params(resumed), expected[0])
    assert torch.equal(torch.cat([p.detach().reshape(-1) for p in resumed.critic.parameters()]), expected[1])
    with pytest.raises(FileNotFoundError, match="critic.pt"):  # a GRPO checkpoint cannot continue as PPO
        grpo = learner(lr=1e-3)
        grpo.step(batches[0])
        checkpoint.save(tmp_path / "grpo", 1, grpo, {"step": 1}, keep=1)
        checkpoint.load(checkpoint.latest(tmp_path / "grpo"), learner(**kw))


def _ppo_replica(rank, world, port, out_path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        group = dist.new_group(list(range(world)))
        tr = learner(group=group, seed=rank, name="ppo", lr=1e-3, ppo_epochs=2, minibatches=2)
        equal = []
        for s in range(2):
            tr.step(make_trajs(40 + s))
            p = torch.cat([flat_params(tr)] + [q.detach().reshape(-1) for q in tr.critic.parameters()])
            everyone = [torch.empty_like(p) for _ in range(world)]
            dist.all_gather(everyone, p, group=group)
            equal.append(all(torch.equal(everyone[0], q) for q in everyone))
        if rank == 0:
            torch.save(equal, out_path)
    finally:
        dist.destroy_process_group()


def test_ppo_replicas_of_policy_and_critic_stay_bitwise_equal(tmp_path):
    out = tmp_path / "equal.pt"
    mp.spawn(_ppo_replica, args=(2, _free_port(), out), nprocs=2, join=True)
    assert torch.load(out) == [True, True]


def test_ppo_keys_are_checked():
    for key, bad in (("gae_lambda", 1.5), ("gamma", -0.1), ("ppo_epochs", 0), ("minibatches", 0),
                     ("critic", "big"), ("critic_lr", 0.0)):
        with pytest.raises(ValueError, match=f"algo.{key}"):
            AlgoConfig(name="ppo", **{key: bad})


def test_a_ppo_run_continues_from_the_warm_starts_last_checkpoint(tmp_path):
    """End to end (smoke): a warm start's checkpoint has no critic; a PPO run resumed from it begins RL with a
    fresh one, as the uninterrupted run does (it failed naming the missing critic.pt before the trainer built
    the warm start's learner to load it), and its RL steps report the critic's metrics."""
    from tests.test_loop import launch, train_steps

    common = ("algo=ppo", "warm_start.steps=2", "warm_start.questions_per_step=2", "checkpoint_every=2")
    r, warm = launch(tmp_path / "a", *common, "steps=0")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    r, run = launch(tmp_path / "b", *common, "steps=2", f"resume={warm}")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert train_steps(run) == [3, 4]
    rl = [x for x in read_metrics(run / "metrics.jsonl") if x.get("train/updates")]
    assert [x["train/updates"] for x in rl] == [4.0, 4.0] and all("train/vf_loss" in x for x in rl)
