"""Training objectives behind one interface, chosen by `algo.name` (searchr1.registry.ALGORITHMS).

An algorithm is constructed from `AlgoConfig` and gives the learner (searchr1/learner.py):
  SUMS                      names of the additive statistics a micro-batch returns (the learner adds "entropy")
  needs_reference           whether a frozen reference policy must be loaded
  sampled                   whether it trains on sampled data (log-probs at the sampling temperature) or on
                            given targets (temperature 1)
  coefficients(trajs)       one float per trajectory (GRPO: its advantage; SFT: 1) and statistics
  trains(coef)              whether a row needs a forward/backward pass at all
  micro_loss(logp_bt, logits_nv, mb, denom, ref_logp_bt) -> (loss, sums by name)
  summarize(sums)           the step's metrics from the all-reduced sums
"""
