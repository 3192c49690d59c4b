"""Training objectives behind one interface, chosen by `algo.name` (searchr1.registry.ALGORITHMS).

An algorithm is constructed from `AlgoConfig` and gives the learner (searchr1/learner.py):
  SUMS                      names of the additive statistics a micro-batch returns (the learner adds "entropy")
  needs_reference           whether a frozen reference policy must be loaded
  needs_proximal            whether, with several updates per batch (algo.ppo_epochs x algo.minibatches), the
                            policy's log-probs before the first are wanted (mb["prox_bt"], computed once)
  build_critic(policy)      extra trainable state, or None: a module applied to the policy's last hidden state at
                            the trained positions (its values reach micro_loss as mb["values_bt"]); the learner
                            trains it (algo.critic_lr), replicates it with DDP, and checkpoints it, and never
                            publishes it to the rollouts
  sampled                   whether it trains on sampled data (log-probs at the sampling temperature) or on
                            given targets (temperature 1)
  coefficients(trajs)       one float per trajectory (GRPO: its advantage; SFT: 1) and statistics
  token_coefficients(values_n, coef_b, reduce)
                            with a critic only: per row of the trained tokens' values before the batch's first update,
                            its per-token advantages and returns (they reach micro_loss as mb["adv_bt"], mb["ret_bt"],
                            beside mb["old_values_bt"]) and statistics; `reduce` sums a tensor over the replicas
  trains(coef)              whether a row needs a forward/backward pass at all
  micro_loss(logp_bt, logits_nv, mb, denom, ref_logp_bt) -> (loss, sums by name)
                            (mb["adv_bt"], when present, replaces the per-trajectory mb["adv_b"])
  summarize(sums)           the step's metrics from the all-reduced sums
"""
