"""GRPO pure functions against values computed by hand."""
import math

import pytest
import torch

from searchr1 import grpo


def test_advantages_hand_computed_with_std():
    # group 7: rewards 1,0,0,0 -> mean 0.25, deviations .75,-.25,-.25,-.25, unbiased var 0.75/3 = .25, std .5
    # group 3: rewards 1,1 -> all equal -> exactly 0 and counted; group 9: a singleton -> 0 and counted
    reward_b = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.5])
    group_b = torch.tensor([7, 7, 3, 7, 7, 3, 9])
    adv_b, n_zero = grpo.group_advantages(reward_b, group_b, normalize_std=True, eps=0.0)
    assert adv_b.tolist() == [1.5, -0.5, 0.0, -0.5, -0.5, 0.0, 0.0]
    assert n_zero == 2
    assert adv_b.dtype == torch.float32


def test_advantages_without_std_and_eps():
    reward_b = torch.tensor([2.0, 0.0, 1.0, 1.0])
    group_b = torch.tensor([0, 0, 1, 1])
    adv_b, n_zero = grpo.group_advantages(reward_b, group_b, normalize_std=False, eps=1e-6)
    assert adv_b.tolist() == [1.0, -1.0, 0.0, 0.0] and n_zero == 1
    # with std: deviations +-1, unbiased std sqrt(2), eps added to the std
    adv_b, _ = grpo.group_advantages(reward_b, group_b, normalize_std=True, eps=0.5)
    assert adv_b[0].item() == pytest.approx(1.0 / (math.sqrt(2.0) + 0.5))
    assert adv_b[1].item() == pytest.approx(-1.0 / (math.sqrt(2.0) + 0.5))


def test_all_equal_group_is_exactly_zero_for_awkward_floats():
    # 0.1 * 3 / 3 - 0.1 is not 0 in floating point; the flat group must still give exact zeros
    adv_b, n_zero = grpo.group_advantages(torch.full((3,), 0.1), torch.zeros(3, dtype=torch.long), True, 1e-6)
    assert torch.equal(adv_b, torch.zeros(3)) and n_zero == 1


def test_advantages_reject_bad_input():
    with pytest.raises(ValueError, match="reward_b"):
        grpo.group_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.long), True, 1e-6)
    with pytest.raises(ValueError, match="non-finite"):
        grpo.group_advantages(torch.tensor([0.0, math.nan]), torch.zeros(2, dtype=torch.long), True, 1e-6)


def test_clipped_loss_value_and_gradient_by_hand():
    # One token per case, old log-prob 0, so ratio = exp(logp). clip_eps 0.2.
    #   A=+1 r=1.5: max(-1.5, -1.2) = -1.2 (clipped, no gradient)
    #   A=-1 r=1.5: max(1.5, 1.2) = 1.5 (unclipped, dL/dlogp = -A r = 1.5)
    #   A=+1 r=0.5: max(-0.5, -0.8) = -0.5 (unclipped, dL/dlogp = -0.5)
    #   A=-1 r=0.5: max(0.5, 0.8) = 0.8 (clipped, no gradient)
    logp_bt = torch.tensor([[math.log(1.5)], [math.log(1.5)], [math.log(0.5)], [math.log(0.5)]],
                           dtype=torch.float64, requires_grad=True)
    adv_b = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    mask_bt = torch.ones(4, 1)
    loss, stats = grpo.policy_loss(logp_bt, torch.zeros_like(logp_bt), adv_b, mask_bt, 0.2, "token_mean")
    assert loss.item() == pytest.approx((-1.2 + 1.5 - 0.5 + 0.8) / 4)
    loss.backward()
    assert logp_bt.grad.squeeze(-1).tolist() == pytest.approx([0.0, 1.5 / 4, -0.5 / 4, 0.0])
    assert stats["clip_frac"].item() == 0.5
    assert stats["tokens"].item() == 4
    # k3 of KL(old || new) with log(new/old) = log r: r - 1 - log r
    k3 = [r - 1 - math.log(r) for r in (1.5, 1.5, 0.5, 0.5)]
    assert stats["approx_kl"].item() == pytest.approx(sum(k3) / 4)


def test_seq_mean_and_token_mean_and_global_denominator():
    # sequence 0 has 3 trained tokens of loss 1 (A=-1, r=1), sequence 1 has 1 trained token of loss 3 (A=-3)
    logp_bt = torch.zeros(2, 3)
    mask_bt = torch.tensor([[1, 1, 1], [0, 1, 0]])
    adv_b = torch.tensor([-1.0, -3.0])
    tok, _ = grpo.policy_loss(logp_bt, logp_bt, adv_b, mask_bt, 0.2, "token_mean")
    seq, _ = grpo.policy_loss(logp_bt, logp_bt, adv_b, mask_bt, 0.2, "seq_mean")
    assert tok.item() == pytest.approx((3 * 1 + 3) / 4)
    assert seq.item() == pytest.approx((1 + 3) / 2)
    # halves of a batch with the whole batch's denominator add up to the whole batch's loss
    for agg in grpo.AGGREGATIONS:
        whole, _ = grpo.policy_loss(logp_bt, logp_bt, adv_b, mask_bt, 0.2, agg)
        d = grpo.loss_denominator(mask_bt, agg)
        parts = [grpo.policy_loss(logp_bt[i:i + 1], logp_bt[i:i + 1], adv_b[i:i + 1], mask_bt[i:i + 1], 0.2,
                                  agg, d)[0] for i in range(2)]
        assert (parts[0] + parts[1]).item() == pytest.approx(whole.item())
    with pytest.raises(ValueError, match="loss aggregation"):
        grpo.policy_loss(logp_bt, logp_bt, adv_b, mask_bt, 0.2, "sum")


def test_information_token_logit_gets_no_gradient():
    torch.manual_seed(0)
    logits_btv = torch.randn(2, 5, 11, requires_grad=True)
    target_bt = torch.randint(0, 11, (2, 5))
    mask_bt = torch.tensor([[1, 1, 0, 0, 1], [0, 1, 1, 1, 0]])
    # the old log-probs of untrained positions are garbage on purpose (the engine writes 0.0, or anything)
    old_bt = torch.where(mask_bt.bool(), torch.full((2, 5), -2.0), torch.full((2, 5), 1e4))
    logp_bt = grpo.token_logprobs(logits_btv, target_bt)
    loss, _ = grpo.policy_loss(logp_bt, old_bt, torch.tensor([1.0, -0.7]), mask_bt, 0.2, "seq_mean")
    kl = grpo.masked_aggregate(grpo.kl_penalty(logp_bt, old_bt, mask_bt, "k3"), mask_bt, "seq_mean")
    (loss + kl).backward()
    assert torch.isfinite(loss)
    off = ~mask_bt.bool()
    assert torch.count_nonzero(logits_btv.grad[off]) == 0
    assert torch.count_nonzero(logits_btv.grad[~off]) > 0


def test_kl_estimators_by_hand():
    logp_bt = torch.tensor([[math.log(0.5), math.log(0.25), 0.0]])
    ref_bt = torch.tensor([[math.log(0.25), math.log(0.5), 5.0]])
    mask_bt = torch.tensor([[1, 1, 0]])
    # log(q/p) = -log 2 and +log 2 on the trained tokens
    l2 = math.log(2.0)
    k1 = grpo.kl_penalty(logp_bt, ref_bt, mask_bt, "k1")
    k2 = grpo.kl_penalty(logp_bt, ref_bt, mask_bt, "k2")
    k3 = grpo.kl_penalty(logp_bt, ref_bt, mask_bt, "k3")
    assert k1.tolist()[0] == pytest.approx([l2, -l2, 0.0])
    assert k2.tolist()[0] == pytest.approx([l2**2 / 2, l2**2 / 2, 0.0])
    assert k3.tolist()[0] == pytest.approx([0.5 - 1 + l2, 2 - 1 - l2, 0.0])
    assert (k3 >= 0).all()
    with pytest.raises(ValueError, match="kl estimator"):
        grpo.kl_penalty(logp_bt, ref_bt, mask_bt, "k4")


def test_k3_is_unbiased_for_the_true_kl():
    # samples from p: E_p[k3] = KL(p || q)
    gen = torch.Generator().manual_seed(0)
    p_v = torch.tensor([0.6, 0.3, 0.1])
    q_v = torch.tensor([0.2, 0.5, 0.3])
    x_n = torch.multinomial(p_v, 200_000, replacement=True, generator=gen)
    est = grpo.kl_penalty(p_v.log()[x_n][None], q_v.log()[x_n][None], torch.ones(1, len(x_n)), "k3").mean()
    assert est.item() == pytest.approx(float((p_v * (p_v / q_v).log()).sum()), rel=0.02)


def test_token_logprobs_and_entropy_match_log_softmax():
    torch.manual_seed(1)
    logits_btv = torch.randn(3, 4, 7, dtype=torch.bfloat16)
    target_bt = torch.randint(0, 7, (3, 4))
    ref_btv = torch.log_softmax(logits_btv.float() / 0.7, dim=-1)
    got = grpo.token_logprobs(logits_btv, target_bt, temperature=0.7)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref_btv.gather(-1, target_bt[..., None])[..., 0])
    ent = grpo.token_entropy(logits_btv, temperature=0.7)
    torch.testing.assert_close(ent, -(ref_btv.exp() * ref_btv).sum(-1))
    assert grpo.token_entropy(torch.zeros(1, 1, 8)).item() == pytest.approx(math.log(8))


@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_decoupled_loss_and_truncated_weights_by_hand(adv):
    """Two trained tokens, current (= proximal) p = [0.5, 0.2], behaviour p = [0.25, 0.4]: importance weights
    [2.0, 0.5], truncated at 1.5 to [1.5, 0.5]. One update per batch: the ratio against the proximal policy is 1,
    so each token's gradient is -A * w_truncated / tokens."""
    logp = torch.tensor([[math.log(0.5), math.log(0.2)]], requires_grad=True)
    old = torch.tensor([[math.log(0.25), math.log(0.4)]])
    mask = torch.ones(1, 2)
    loss, st = grpo.decoupled_policy_loss(logp, old, torch.tensor([adv]), mask, clip_eps=0.2, is_cap=1.5,
                                          agg="token_mean")
    assert loss.item() == pytest.approx(-adv * (1.5 + 0.5) / 2)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-adv * 0.75, -adv * 0.25])
    assert st["is_sum"].item() == pytest.approx(2.5) and st["is_sq_sum"].item() == pytest.approx(4.25)
    assert st["is_truncated"].item() == 1 and st["is_max"].item() == pytest.approx(2.0)
    assert st["clip_frac"].item() == 0.0
    # the naive ratio against the behaviour policy clips the stale token (no gradient) when A > 0 ...
    logp2 = logp.detach().clone().requires_grad_(True)
    naive, _ = grpo.policy_loss(logp2, old, torch.tensor([adv]), mask, clip_eps=0.2, agg="token_mean")
    naive.backward()
    want = [0.0, -adv * 0.25] if adv > 0 else [-adv * 1.0, 0.0]  # ... and the other token when A < 0
    assert logp2.grad[0].tolist() == pytest.approx(want)


def test_decoupled_loss_on_policy_is_the_plain_policy_gradient():
    """Behaviour equal to the current policy: weights 1, the decoupled loss equals PPO's."""
    torch.manual_seed(0)
    logp = torch.randn(3, 5) - 2
    mask = (torch.rand(3, 5) > 0.3).float()
    adv = torch.tensor([1.0, -0.5, 2.0])
    a, _ = grpo.decoupled_policy_loss(logp, logp, adv, mask, 0.2, 2.0, "token_mean")
    b, _ = grpo.policy_loss(logp, logp, adv, mask, 0.2, "token_mean")
    assert a.item() == pytest.approx(b.item())


def test_decoupled_loss_with_a_proximal_pass_drops_overweight_tokens_and_clips():
    """Several steps per batch (AReaL): proximal p = [0.5, 0.2, 0.3], behaviour p = [0.25, 0.4, 0.3] give
    w = [2.0, 0.5, 1.0]; with is_cap 1.5 the first token is dropped (weight 0, still in the denominator), not
    clamped to 1.5. The current policy has moved: ratios to the proximal one [1, 1.5, 1.0]; with A = 1 and
    eps 0.2 the second token is clipped (no gradient), so the clip acts and clip_frac = 1/3."""
    prox = torch.tensor([[math.log(0.5), math.log(0.2), math.log(0.3)]])
    old = torch.tensor([[math.log(0.25), math.log(0.4), math.log(0.3)]])
    logp = (prox + torch.tensor([[0.0, math.log(1.5), 0.0]])).requires_grad_(True)
    loss, st = grpo.decoupled_policy_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 3), clip_eps=0.2,
                                          is_cap=1.5, agg="token_mean", prox_logp_bt=prox)
    # token 1: dropped -> 0; token 2: clipped ratio 1.2 * w 0.5; token 3: ratio 1 * w 1
    assert loss.item() == pytest.approx(-(0.0 + 1.2 * 0.5 + 1.0) / 3)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.0, -1.0 / 3])
    assert st["clip_frac"].item() == pytest.approx(1 / 3)
    assert st["is_truncated"].item() == 1 and st["is_max"].item() == pytest.approx(2.0)


def test_decoupled_loss_with_one_step_per_batch_never_clips():
    """Without a proximal pass the ratio is exactly 1 whatever the behaviour policy: clip_frac is 0 even where
    the plain PPO ratio against behaviour is far outside [1 - eps, 1 + eps]."""
    torch.manual_seed(0)
    logp = torch.randn(4, 6) - 2
    old = logp + 2 * torch.randn(4, 6)
    _, st = grpo.decoupled_policy_loss(logp, old, torch.tensor([1.0, -1.0, 2.0, -0.5]), torch.ones(4, 6), 0.2,
                                       2.0, "token_mean")
    _, naive = grpo.policy_loss(logp, old, torch.tensor([1.0, -1.0, 2.0, -0.5]), torch.ones(4, 6), 0.2,
                                "token_mean")
    assert st["clip_frac"].item() == 0.0 and naive["clip_frac"].item() > 0.3


def test_rloo_advantages_leave_each_sample_out_of_its_own_baseline():
    from searchr1.grpo import rloo_advantages

    # group 0: 1, 0, 0, 1 -> a 1's baseline is (0 + 0 + 1) / 3, a 0's is (1 + 0 + 1) / 3; group 1 flat; group 2 alone
    reward_b = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    group_b = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    adv_b, n_flat = rloo_advantages(reward_b, group_b)
    assert adv_b.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 0.0])
    assert n_flat == 2 and adv_b[4:].eq(0).all()


def test_algo_rloo_is_a_registry_line_with_grpos_loss():
    import launch
    from searchr1 import registry
    from searchr1.trajectory import Trajectory

    cfg = launch.compose_config(["+experiment=smoke", "algo=rloo"])
    algo = registry.resolve(registry.ALGORITHMS, cfg.algo.name, "algo.name")(cfg.algo)
    trajs = [Trajectory(qid="q", group=0, prompt_ids=[1], response_ids=[2], loss_mask=[1], logprobs=[-1.0], reward=r)
             for r in (1.0, 0.0, 0.0)]
    adv_b, stats = algo.coefficients(trajs)
    assert adv_b.tolist() == pytest.approx([1.0, -0.5, -0.5]) and stats["zero_adv_groups"] == 0


def test_dynamic_sampling_keeps_the_groups_whose_rewards_vary_first():
    from searchr1.grpo import varied_groups_first

    reward_g = [[1, 1], [0, 1], [0, 0], [1, 0, 0], [0.5, 0.5]]
    assert varied_groups_first(reward_g, 2) == [1, 3]  # the two varied groups, in draw order
    assert varied_groups_first(reward_g, 3) == [0, 1, 3]  # then the first flat one
    assert varied_groups_first(reward_g, 9) == [0, 1, 2, 3, 4]
    assert varied_groups_first([[1]], 1) == [0]  # a single sample never varies, but fills


def test_oversampled_steps_draw_more_questions_and_share_the_kept_groups_among_units():
    import launch
    from searchr1.schedule import make_schedule

    cfg = launch.compose_config(["+experiment=smoke", "algo.questions_per_step=4", "algo.oversample=3"])
    plain = launch.compose_config(["+experiment=smoke", "algo.questions_per_step=4"])
    step = cfg.warm_start.steps
    units = make_schedule(cfg).units(step, 2, 500)
    assert [len(u.questions) for u in units] == [6, 6] and [u.keep for u in units] == [2, 2]
    assert [u.group_offset for u in units] == [0, 6]
    base = make_schedule(plain).units(step, 2, 500)
    assert [u.keep for u in base] == [0, 0] and [len(u.questions) for u in base] == [2, 2]
    with pytest.raises(SystemExit, match="algo.oversample=0: must be > 0"):
        launch.compose_config(["+experiment=smoke", "algo.oversample=0"])
