"""The trainer role on the tiny random Llama: exact masks, sharding, DDP replicas, checkpoints, learning."""
import os
import random
import socket
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from searchr1.config import AlgoConfig, ModelConfig
from searchr1.trainer import Trainer, collate, pack_micro_batches, shard_indices
from searchr1.trajectory import Trajectory

os.environ.setdefault("WANDB_MODE", "disabled")
INFO_ID = 1234  # stands for an inserted <information> token
# Adam divides by |g| + 1e-8: a coordinate whose gradient is near 1e-8 turns a float-rounding difference of the
# gradient (another summation order) into up to ~1% of one step's size. Compare parameters after one step
# with that much slack, in units of the learning rate.
ADAM_ATOL = 0.01


def tiny(dtype="float32"):
    return ModelConfig(name="tiny", source="tiny", dtype=dtype)


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
        assert mb["attn_bt"][i].sum() == n


# ---------------------------------------------------------------- one replica


def test_step_metrics_and_flat_groups():
    tr = Trainer(tiny(), AlgoConfig(lr=1e-3, weight_decay=0.0), "cpu", seed=0)
    before = flat_params(tr)
    flat = make_trajs(1, n_groups=2, group_size=3, flat_groups=(0, 1))
    m = tr.step(flat)
    # every group flat: no advantage, nothing trained, and with no weight decay Adam's zero step keeps the weights
    assert m["zero_adv_groups"] == 2 and m["tokens_trained"] == 0 and m["grad_norm"] == 0
    assert torch.equal(flat_params(tr), before)
    trajs = make_trajs(2, n_groups=3, group_size=3, flat_groups=(1,))
    m = tr.step(trajs)
    assert m["zero_adv_groups"] == 1 and m["groups"] == 3 and m["step"] == 2
    assert m["tokens_generated"] == sum(t.generated_tokens for t in trajs)
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
        tr = Trainer(tiny(), AlgoConfig(lr=1e-3), "cpu", seed=0)
        tr.step(trajs)
        params.append(flat_params(tr))
    assert torch.equal(params[0], params[1])


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
def test_micro_batching_does_not_change_the_update(agg):
    trajs = make_trajs(4, n_groups=3, group_size=4)
    params = []
    for budget in (100_000, 40):  # one micro-batch vs many (gradient accumulation)
        tr = Trainer(tiny(), AlgoConfig(lr=1e-3, loss_agg=agg, micro_batch_tokens=budget), "cpu", seed=0)
        tr.step(trajs)
        params.append(flat_params(tr))
    torch.testing.assert_close(params[0], params[1], rtol=0, atol=ADAM_ATOL * 1e-3)


def test_reference_model_only_with_kl():
    assert Trainer(tiny(), AlgoConfig(kl_coef=0.0), "cpu").ref is None
    tr = Trainer(tiny("bfloat16"), AlgoConfig(kl_coef=0.001, lr=1e-3), "cpu")
    assert tr.ref is not None and not any(p.requires_grad for p in tr.ref.parameters())
    ref_before = [p.clone() for p in tr.ref.parameters()]
    m1 = tr.step(make_trajs(5))
    m2 = tr.step(make_trajs(6))
    assert m1["kl_ref"] < 1e-4  # the policy starts as the reference
    assert m2["kl_ref"] > m1["kl_ref"]
    assert all(torch.equal(a, b) for a, b in zip(ref_before, tr.ref.parameters()))


def test_bad_trajectories_are_named():
    tr = Trainer(tiny(), AlgoConfig(), "cpu")
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
    with pytest.raises(ValueError, match="temperature"):
        Trainer(tiny(), AlgoConfig(), "cpu", temperature=0.0)


def test_bf16_weights_are_hf_named_tied_once():
    tr = Trainer(tiny(), AlgoConfig(lr=1e-2), "cpu")
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
    algo = AlgoConfig(lr=1e-3, warmup_steps=3)  # the scheduler's position matters at steps 3 and 4
    batches = [make_trajs(10 + s) for s in range(4)]
    run = Trainer(tiny("bfloat16"), algo, "cpu", seed=0)
    for trajs in batches[:2]:
        run.step(trajs)
    run.save_checkpoint(tmp_path / "ckpt", extra={"data_position": 2, "weights_version": 7})
    after_save = torch.rand(3)
    for trajs in batches[2:]:
        run.step(trajs)
    del run.optimizer  # the interrupted run is gone: nothing below may read from it
    expected = flat_params(run)

    torch.manual_seed(123)  # a fresh process has other RNG states
    resumed = Trainer(tiny("bfloat16"), algo, "cpu", seed=1)
    extra = resumed.load_checkpoint(tmp_path / "ckpt")
    assert extra == {"data_position": 2, "weights_version": 7} and resumed.step_count == 2
    assert torch.equal(torch.rand(3), after_save)
    metrics = [resumed.step(trajs) for trajs in batches[2:]]
    assert [m["lr"] for m in metrics] == [1e-3, 1e-3] and resumed.step_count == 4
    assert torch.equal(flat_params(resumed), expected)


def test_checkpoint_is_an_hf_model_and_writes_atomically(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    tr = Trainer(tiny(), AlgoConfig(lr=1e-2), "cpu")
    tr.step(make_trajs(20))
    tr.save_checkpoint(tmp_path / "ckpt", extra={"v": 1})
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "model", dtype=torch.float32)
    for (n, p), q in zip(tr.model.named_parameters(), hf.parameters()):
        assert torch.equal(p, q), n

    tr.step(make_trajs(21))

    def broken_save(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        tr.save_checkpoint(tmp_path / "ckpt", extra={"v": 2})
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp directory left behind
    assert Trainer(tiny(), AlgoConfig(), "cpu").load_checkpoint(tmp_path / "ckpt") == {"v": 1}
    with pytest.raises(FileNotFoundError, match="not a trainer checkpoint"):
        tr.load_checkpoint(tmp_path)
