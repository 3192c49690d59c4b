"""The learner on the tiny random Llama: exact masks, sharding, DDP replicas, checkpoints, learning."""
import os
import random
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from searchr1 import checkpoint
from searchr1.config import AlgoConfig, ModelConfig, OptimConfig, TrainerConfig
from searchr1.learner import Learner, collate, pack_micro_batches, shard_indices
from searchr1.trajectory import Trajectory

os.environ.setdefault("WANDB_MODE", "disabled")
INFO_ID = 1234  # stands for an inserted <information> token
# Adam divides by |g| + 1e-8: a coordinate whose gradient is near 1e-8 turns a float-rounding difference of the
# gradient (another summation order) into up to ~1% of one step's size, and rarely (a handful of 3.2M
# coordinates of the tiny model, measured) into a few percent. Compare parameters after one step with that much
# slack, in units of the learning rate, allowing one coordinate in 100,000 past it but none past one step.
ADAM_ATOL = 0.01


def assert_same_update(a, b, lr, atol=ADAM_ATOL):
    diff = (a - b).abs()
    assert diff.max().item() <= lr, f"a coordinate moved by {diff.max().item():.3g} > one step ({lr})"
    beyond = int((diff > atol * lr).sum())
    assert beyond <= max(1, diff.numel() // 100_000), f"{beyond} coordinates differ by more than {atol} steps"


_OPTIM = {"lr", "weight_decay", "warmup_steps"}
_TRAINER = {"micro_batch_tokens", "gradient_checkpointing", "train_top_layers"}


def learner(dtype="float32", group=None, seed=0, **kw):
    """A Learner of the tiny model computing in `dtype`; each keyword goes to the config group that owns it."""
    optim = OptimConfig(**{k: v for k, v in kw.items() if k in _OPTIM})
    trainer = TrainerConfig(compute_dtype=dtype, **{k: v for k, v in kw.items() if k in _TRAINER})
    algo = AlgoConfig(**{k: v for k, v in kw.items() if k not in _OPTIM | _TRAINER})
    return Learner(ModelConfig(name="tiny", source="tiny"), algo, optim, trainer, "cpu", group=group, seed=seed)


def metrics(m):
    return {k.removeprefix("train/"): v for k, v in m.items()}


def make_trajs(seed, n_groups=3, group_size=3, flat_groups=(1,)):
    """Random trajectories with an information block inside each response; groups in `flat_groups` get equal
    rewards (zero advantage). Lengths differ, so shards and micro-batches are uneven."""
    rnd = random.Random(seed)
    out = []
    for g in range(n_groups):
        prompt = [rnd.randrange(100, 40000) for _ in range(rnd.randrange(3, 12))]
        for _ in range(group_size):
            n = rnd.randrange(4, 20)
            mask = [0 if 2 <= i < 5 else 1 for i in range(n)]
            resp = [INFO_ID if m == 0 else rnd.randrange(100, 40000) for m in mask]
            logp = [-rnd.uniform(5.0, 12.0) if m else 0.0 for m in mask]
            reward = 0.5 if g in flat_groups else float(rnd.random() < 0.5) + rnd.random()
            out.append(Trajectory(qid=f"q{seed}-{g}", group=g, prompt_ids=prompt, response_ids=resp,
                                  loss_mask=mask, logprobs=logp, reward=reward))
    return out


def flat_params(trainer):
    return torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])


# ---------------------------------------------------------------- pure pieces


def test_shards_partition_and_balance():
    lengths = [5, 50, 7, 33, 12, 40, 9]
    shards = [shard_indices(lengths, 3, r) for r in range(3)]
    assert sorted(sum(shards, [])) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in s) for s in shards]
    assert max(loads) - min(loads) <= max(lengths) // 2
    assert shard_indices(lengths, 1, 0) == sorted(range(7), key=lambda i: -lengths[i])


def test_micro_batches_respect_the_token_budget():
    lengths = [10, 30, 8, 25, 100, 12]
    batches = pack_micro_batches(lengths, 60)
    assert sorted(sum(batches, [])) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 60
    assert [4] in batches  # longer than the budget: alone


def test_collate_aligns_targets_mask_and_logprobs():
    trajs = make_trajs(0, n_groups=2, group_size=2)
    adv_b = torch.arange(4, dtype=torch.float32)
    mb = collate(trajs, adv_b, pad_id=2, device="cpu")
    assert mb["target_bt"].shape == mb["mask_bt"].shape == mb["old_bt"].shape
    for i, t in enumerate(trajs):
        on = mb["mask_bt"][i].bool()
        assert mb["target_bt"][i][on].tolist() == [x for x, m in zip(t.response_ids, t.loss_mask) if m]
        assert mb["old_bt"][i][on].tolist() == pytest.approx([x for x, m in zip(t.logprobs, t.loss_mask) if m])
        n = len(t.prompt_ids) + len(t.response_ids)
        assert mb["ids_bt"][i, :n].tolist() == t.prompt_ids + t.response_ids
        assert (mb["ids_bt"][i, n:] == 2).all()  # right padding: what the causal mask alone keeps exact


def test_a_padded_batch_scores_each_row_as_the_model_does_alone():
    """No attention mask over right padding, and the output layer on the trained positions only: each row's
    log-probs are those of the plain model run on that row alone."""
    tr = learner()
    trajs = make_trajs(3, n_groups=2, group_size=3)
    assert len({len(t.prompt_ids) + len(t.response_ids) for t in trajs}) > 1  # the batch is padded
    mb = collate(trajs, torch.zeros(len(trajs)), tr.pad_id, "cpu")
    with torch.no_grad():
        logp_bt, logits_nv = tr._logprobs(tr.scorer, mb)
    assert logits_nv.shape[0] == int(mb["mask_bt"].sum())
    for i, t in enumerate(trajs):
        with torch.no_grad():
            logits_tv = tr.model(input_ids=torch.tensor([t.prompt_ids + t.response_ids])).logits[0]
        logp_tv = torch.log_softmax(logits_tv.float(), dim=-1)
        p = len(t.prompt_ids)
        want = [logp_tv[p - 1 + j, x].item() for j, (x, m) in enumerate(zip(t.response_ids, t.loss_mask)) if m]
        assert logp_bt[i][mb["mask_bt"][i].bool()].tolist() == pytest.approx(want, abs=1e-5)


# ---------------------------------------------------------------- one replica


def test_step_metrics_and_flat_groups():
    tr = learner(lr=1e-3, weight_decay=0.0)
    before = flat_params(tr)
    flat = make_trajs(1, n_groups=2, group_size=3, flat_groups=(0, 1))
    m = metrics(tr.step(flat))
    # every group flat: no advantage, nothing trained, and with no weight decay Adam's zero step keeps the weights
    assert m["zero_adv_groups"] == 2 and m["tokens_trained"] == 0 and m["grad_norm"] == 0
    assert torch.equal(flat_params(tr), before)
    trajs = make_trajs(2, n_groups=3, group_size=3, flat_groups=(1,))
    m = metrics(tr.step(trajs))
    assert m["zero_adv_groups"] == 1 and m["groups"] == 3 and m["step"] == 2
    assert m["tokens_trained"] == sum(t.generated_tokens for t in trajs if t.group != 1)  # flat group skipped
    assert m["seqs_trained"] == 6
    assert m["grad_norm"] > 0 and m["entropy"] > 0 and 0 <= m["clip_frac"] <= 1 and m["approx_kl"] >= 0
    assert abs(m["adv_mean"]) < 1e-6 and m["lr"] == 1e-3
    assert not torch.equal(flat_params(tr), before)


def test_information_tokens_behaviour_logprobs_do_not_matter():
    a = make_trajs(3)
    b = make_trajs(3)
    for t in b:  # rewrite what the engine reported for inserted tokens: must change nothing
        t.logprobs = [x if m else 99.0 for x, m in zip(t.logprobs, t.loss_mask)]
    params = []
    for trajs in (a, b):
        tr = learner(lr=1e-3)
        tr.step(trajs)
        params.append(flat_params(tr))
    assert torch.equal(params[0], params[1])


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
def test_micro_batching_does_not_change_the_update(agg):
    trajs = make_trajs(4, n_groups=3, group_size=4)
    params = []
    for budget in (100_000, 40):  # one micro-batch vs many (gradient accumulation)
        tr = learner(lr=1e-3, loss_agg=agg, micro_batch_tokens=budget)
        tr.step(trajs)
        params.append(flat_params(tr))
    assert_same_update(params[0], params[1], lr=1e-3)


def test_gradient_checkpointing_does_not_change_the_update():
    trajs = make_trajs(9)
    params = []
    for ckpt in (False, True):
        tr = learner(lr=1e-3, gradient_checkpointing=ckpt)
        assert tr.model.is_gradient_checkpointing == ckpt
        tr.step(trajs)
        params.append(flat_params(tr))
    assert_same_update(params[0], params[1], lr=1e-3)


def test_reference_model_only_with_kl():
    assert learner(kl_coef=0.0).ref is None
    tr = learner("bfloat16", kl_coef=0.001, lr=1e-3)
    assert tr.ref is not None and not any(p.requires_grad for p in tr.ref.parameters())
    ref_before = [p.clone() for p in tr.ref.parameters()]
    m1 = metrics(tr.step(make_trajs(5)))
    m2 = metrics(tr.step(make_trajs(6)))
    assert m1["kl_ref"] < 1e-4  # the policy starts as the reference
    assert m2["kl_ref"] > m1["kl_ref"]
    assert all(torch.equal(a, b) for a, b in zip(ref_before, tr.ref.parameters()))


def test_bad_trajectories_are_named():
    tr = learner()
    with pytest.raises(ValueError, match="no trajectories"):
        tr.step([])
    bad = make_trajs(7)
    bad[1].prompt_ids = []
    with pytest.raises(ValueError, match=f"{bad[1].qid}: empty prompt_ids"):
        tr.step(bad)
    bad = make_trajs(7)
    bad[2].response_ids[0] = 10**6
    with pytest.raises(ValueError, match=f"{bad[2].qid}: token ids \\[1000000\\]"):
        tr.step(bad)


def test_bf16_weights_are_hf_named_tied_once():
    tr = learner(lr=1e-2)
    tr.step(make_trajs(8))
    w = tr.bf16_weights()
    names = list(tr.model.state_dict())
    assert list(w) == [n for n in names if n != "lm_head.weight"]  # tied to model.embed_tokens.weight
    for n, t in w.items():
        assert t.dtype == torch.bfloat16 and t.is_contiguous()
        assert torch.equal(t, tr.model.state_dict()[n].to(torch.bfloat16))
        assert t.data_ptr() != tr.model.state_dict()[n].data_ptr()


# ---------------------------------------------------------------- checkpoints


def test_kill_and_resume_is_bitwise(tmp_path):
    batches = [make_trajs(10 + s) for s in range(4)]
    # the scheduler's position matters at steps 3 and 4
    run = learner("bfloat16", lr=1e-3, warmup_steps=3)
    for trajs in batches[:2]:
        run.step(trajs)
    checkpoint.save(tmp_path, 2, run, {"data_position": 2, "weights_version": 7}, keep=2)
    after_save = torch.rand(3)
    for trajs in batches[2:]:
        run.step(trajs)
    del run.optimizer  # the interrupted run is gone: nothing below may read from it
    expected = flat_params(run)

    torch.manual_seed(123)  # a fresh process has other RNG states
    resumed = learner("bfloat16", seed=1, lr=1e-3, warmup_steps=3)
    extra = checkpoint.load(checkpoint.latest(tmp_path), resumed)
    assert extra == {"data_position": 2, "weights_version": 7} and resumed.step_count == 2
    assert torch.equal(torch.rand(3), after_save)
    got = [resumed.step(trajs) for trajs in batches[2:]]
    assert [m["train/lr"] for m in got] == [1e-3, 1e-3] and resumed.step_count == 4
    assert torch.equal(flat_params(resumed), expected)


def test_checkpoint_is_an_hf_model_and_writes_atomically(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    tr = learner(lr=1e-2)
    tr.step(make_trajs(20))
    first = checkpoint.save(tmp_path, 1, tr, {"v": 1}, keep=1)
    hf = AutoModelForCausalLM.from_pretrained(checkpoint.model_path(first), dtype=torch.float32)
    for (n, p), q in zip(tr.model.named_parameters(), hf.parameters()):
        assert torch.equal(p, q), n

    tr.step(make_trajs(21))

    def broken_save(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(tmp_path, 2, tr, {"v": 2}, keep=1)
    monkeypatch.undo()
    ckpts = tmp_path / "checkpoints"
    # no temp directory left behind, and the pointer still names the complete checkpoint
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_000001"]
    assert checkpoint.latest(tmp_path) == first and checkpoint.load(first, learner()) == {"v": 1}
    with pytest.raises(FileNotFoundError, match="not a trainer checkpoint"):
        checkpoint.load(ckpts, tr)


def test_rotation_keeps_the_newest_and_the_pointer_moves_last(tmp_path):
    tr = learner(lr=1e-2)
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, step, tr, {"step": step}, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000002", "step_000003"]
    assert checkpoint.latest(tmp_path).name == "step_000003"
    assert checkpoint.resume_point(tmp_path / "fresh", str(tmp_path)).name == "step_000003"
    assert checkpoint.resume_point(tmp_path / "fresh", "") is None


# ---------------------------------------------------------------- two replicas (gloo, loopback)

REPLICA_CASES = {
    # name: (compute dtype, algo overrides, max |param difference| in learning rates, max relative difference of
    # the total update ||u_2 - u_1|| / ||u_1|| after the four steps)
    "fp32_token_accumulate": ("float32", {"micro_batch_tokens": 48, "gradient_checkpointing": True}, ADAM_ATOL, 1e-5),
    "fp32_seq_kl_entropy": ("float32", {"loss_agg": "seq_mean", "kl_coef": 0.01, "entropy_coef": 0.01},
                            ADAM_ATOL, 1e-5),
    # bf16 autocast rounds differently for other batch shapes (a replica's micro-batches are not the single
    # replica's), and Adam turns that into sign flips on near-zero gradients: replicas stay bitwise equal to each
    # other, and the update matches the single replica's to 0.6% (measured), checked at 2%.
    "bf16_default": ("bfloat16", {}, None, 0.02),
}


def replica_batches():
    """Four steps: uneven shards; a step where only one row is trainable (one replica idles); all flat."""
    idle = make_trajs(32, n_groups=2, group_size=2, flat_groups=(1,))
    idle[0].reward, idle[1].reward = 1.0, 0.0
    idle[1].loss_mask = [0] * len(idle[1].loss_mask)
    return [make_trajs(30, n_groups=3, group_size=3), make_trajs(31, n_groups=4, group_size=2, flat_groups=()),
            idle, make_trajs(33, n_groups=2, group_size=2, flat_groups=(0, 1))]


def _replica_worker(rank, world, port, out_path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        group = dist.new_group(list(range(world)))  # like dist.Groups.trainer
        result = {}
        for name, (dtype, overrides, _, _) in REPLICA_CASES.items():
            tr = learner(dtype, group=group, seed=rank, lr=1e-3, **overrides)
            equal = []
            for trajs in replica_batches():
                tr.step(trajs)
                p = flat_params(tr)
                everyone = [torch.empty_like(p) for _ in range(world)]
                dist.all_gather(everyone, p, group=group)
                equal.append(all(torch.equal(everyone[0], q) for q in everyone))
            result[name] = {"equal": equal, "params": p}
        if rank == 0:
            torch.save(result, out_path)
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_replicas_match_one_and_stay_bitwise_equal(tmp_path):
    out = tmp_path / "replicas.pt"
    mp.spawn(_replica_worker, args=(2, _free_port(), out), nprocs=2, join=True)
    got = torch.load(out)
    for name, (dtype, overrides, atol, rel_tol) in REPLICA_CASES.items():
        assert got[name]["equal"] == [True] * 4, name
        single = learner(dtype, lr=1e-3, **overrides)
        p0 = flat_params(single)
        for trajs in replica_batches():
            single.step(trajs)
        u2, u1 = got[name]["params"] - p0, flat_params(single) - p0
        assert ((u2 - u1).norm() / u1.norm()).item() < rel_tol, name
        if atol is not None:
            assert_same_update(u2, u1, lr=1e-3, atol=atol)


# ---------------------------------------------------------------- the policy learns (and unlearns)

QUESTIONS = ["What is the capital of France?", "Who wrote Hamlet?", "How many legs does a spider have?",
             "Which river flows through Cairo?"]
LEARN_GROUP, LEARN_STEPS, LEARN_LR = 16, 20, 5e-2


@torch.no_grad()
def sample_first_tokens(model, prompt_ids, n, gen):
    """n samples of [first token, <information>, second token] from the policy itself, with the behaviour
    log-probs of the two sampled tokens (what an engine reports)."""
    ids = torch.tensor(prompt_ids).repeat(n, 1)
    toks, logps = [], []
    for k in range(2):
        logp_bv = torch.log_softmax(model(input_ids=ids, logits_to_keep=1).logits[:, -1].float(), dim=-1)
        tok_b1 = torch.multinomial(logp_bv.exp(), 1, generator=gen)
        toks.append(tok_b1[:, 0])
        logps.append(logp_bv.gather(-1, tok_b1)[:, 0])
        ids = torch.cat([ids, tok_b1] + ([torch.full_like(tok_b1, INFO_ID)] if k == 0 else []), dim=1)
    return [[int(a), INFO_ID, int(b)] for a, b in zip(*toks)], [[float(a), 0.0, float(b)] for a, b in zip(*logps)]


def learning_curve(sign: float, stop_at: float | None) -> list[float]:
    """Mean reward per step. Reward 1 when the first answer token is in a fixed 10% of the vocabulary (the
    tokens furthest along a random direction of the initial embedding space), so the random policy starts near
    0.1; `sign` multiplies the reward handed to the trainer, flipping every advantage."""
    tr = learner(group_size=LEARN_GROUP, questions_per_step=len(QUESTIONS), lr=LEARN_LR)
    emb_vd = tr.model.get_input_embeddings().weight.detach()
    along_v = emb_vd @ torch.randn(emb_vd.shape[1], generator=torch.Generator().manual_seed(1))
    target_v = torch.zeros(emb_vd.shape[0], dtype=torch.bool)
    target_v[along_v.topk(emb_vd.shape[0] // 10).indices] = True
    prompts = [tr.tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                tokenize=True, return_dict=True)["input_ids"] for q in QUESTIONS]
    gen = torch.Generator().manual_seed(0)
    curve = []
    for _ in range(LEARN_STEPS):
        trajs = []
        for g, prompt in enumerate(prompts):
            responses, logps = sample_first_tokens(tr.model, prompt, LEARN_GROUP, gen)
            for resp, lp in zip(responses, logps):
                trajs.append(Trajectory(qid=f"q{g}", group=g, prompt_ids=list(prompt), response_ids=resp,
                                        loss_mask=[1, 0, 1], logprobs=lp, reward=float(target_v[resp[0]])))
        curve.append(sum(t.reward for t in trajs) / len(trajs))
        for t in trajs:
            t.reward *= sign
        tr.step(trajs)
        if stop_at is not None and len(curve) >= 3 and sum(curve[-3:]) / 3 >= stop_at:
            break
    return curve


def test_policy_learns_a_reachable_reward_and_not_with_flipped_advantages():
    up = learning_curve(+1.0, stop_at=0.8)
    assert sum(up[:2]) / 2 < 0.3, up  # it did start low
    assert sum(up[-3:]) / 3 >= 0.8, up  # and got there within LEARN_STEPS
    down = learning_curve(-1.0, stop_at=None)
    assert len(down) == LEARN_STEPS
    assert max(sum(down[i:i + 3]) / 3 for i in range(len(down) - 2)) < 0.8, down
    assert sum(down[-3:]) / 3 < sum(down[:3]) / 3, down


def test_sft_lowers_the_nll_of_generated_tokens_and_ignores_information():
    trajs = make_trajs(40, n_groups=2, group_size=2)
    tr = learner(name="sft", group_size=1, lr=1e-2)
    nll = [metrics(tr.step(trajs))["nll"] for _ in range(5)]
    assert nll[-1] < nll[0] * 0.7, nll
    # information tokens carry no loss: changing them in the targets changes nothing of the first update
    a, b = learner(name="sft", group_size=1, lr=1e-2), learner(name="sft", group_size=1, lr=1e-2)
    other = make_trajs(40, n_groups=2, group_size=2)
    for t in other:
        t.response_ids = [x if m else 4321 for x, m in zip(t.response_ids, t.loss_mask)]
    ma, mb = metrics(a.step(trajs)), metrics(b.step(other))
    assert ma["tokens_trained"] == mb["tokens_trained"] == sum(t.generated_tokens for t in trajs)


def test_training_only_the_top_layers_leaves_the_rest_bit_for_bit():
    tr = learner(lr=1e-2, train_top_layers=1)
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.step(make_trajs(41))
    moved = {n for n, p in tr.model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all(n.startswith(("model.layers.1.", "model.norm.")) for n in moved), sorted(moved)
    with pytest.raises(ValueError, match="train_top_layers=3: the model has 2 decoder layers"):
        learner(train_top_layers=3)


def test_the_trainer_recomputes_behaviour_log_probs_at_the_sampling_temperature():
    """Trajectories sampled at T=0.6 by the model itself: recomputed at 0.6 their ratios are 1 (up to float
    noise); recomputed at temperature 1 they are not."""
    T = 0.6
    probe = learner()
    model, tok = probe.model, probe.tokenizer
    gen = torch.Generator().manual_seed(0)
    trajs = []
    for g in range(3):
        prompt = [100 + g, 200 + g, 300 + g]
        with torch.no_grad():
            ids = torch.tensor([prompt])
            resp, lps = [], []
            for _ in range(4):
                logp = torch.log_softmax(model(input_ids=ids).logits[0, -1].float() / T, -1)
                t = int(torch.multinomial(logp.exp(), 1, generator=gen))
                resp.append(t), lps.append(float(logp[t]))
                ids = torch.cat([ids, torch.tensor([[t]])], 1)
        for r in (0.0, 1.0):
            trajs.append(Trajectory(qid=f"q{g}", group=g, prompt_ids=prompt, response_ids=resp, loss_mask=[1] * 4,
                                    logprobs=lps, reward=r))
    at_t = metrics(Learner(ModelConfig(name="tiny", source="tiny"), AlgoConfig(), OptimConfig(lr=1e-9),
                           TrainerConfig(compute_dtype="float32"), "cpu", temperature=T).step(trajs))
    at_1 = metrics(learner(lr=1e-9).step(trajs))
    assert at_t["approx_kl"] < 1e-6 and abs(at_t["is/mean"] - 1) < 1e-4 and at_t["is/ess"] > 0.999
    assert at_1["approx_kl"] > 1e-3


def test_a_resume_after_the_warm_start_keeps_the_warm_started_kl_reference(tmp_path):
    """Issue 26, finding 3: the reference is the policy where RL began; a learner rebuilt for a resume loaded
    the base model as its reference, so the KL term pulled towards another policy than the uninterrupted run's."""
    run = learner(lr=1e-2, kl_coef=0.1)
    for s in range(2):  # the warm start's updates
        run.step(make_trajs(60 + s))
    run.restart(AlgoConfig(kl_coef=0.1), OptimConfig(lr=1e-2))  # where RL begins (trainer.py)
    run.step(make_trajs(62))  # RL: the reference is the policy after the warm start
    checkpoint.save(tmp_path, 3, run, {"step": 3}, keep=1)
    want = {k: v.clone() for k, v in run.ref.policy.state_dict().items()}
    resumed = learner(lr=1e-2, kl_coef=0.1, seed=1)
    base = {k: v.clone() for k, v in resumed.ref.policy.state_dict().items()}
    checkpoint.load(checkpoint.latest(tmp_path), resumed)
    got = resumed.ref.policy.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want) and resumed.ref_step == 2
    assert not all(torch.equal(base[k], want[k]) for k in want)  # the base model is not that reference
    assert torch.equal(flat_params(resumed), flat_params(run))
