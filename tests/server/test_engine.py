"""Engine correctness on the tiny model, CPU, greedy, exact token equality.

KV-cache decode vs full recompute; concurrent vs alone; chunked vs unchunked prefill; prefix-cache
hits; no KV block leaks after completion, cancellation and preemption; counters that add up.
"""

from __future__ import annotations

import random

import pytest
import torch
from preheat_server.engine import EngineConfig, LLMEngine, SamplingParams
from preheat_server.engine.attention import decode_groups
from preheat_server.engine.scheduler import ItlController
from preheat_server.models import load_model

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)  # 2 shared cores: extra OpenMP threads only spin
    return load_model("tiny", device="cpu", precision="fp32")


def make_engine(tiny, **kw) -> LLMEngine:
    cfg = dict(max_num_seqs=32, max_num_batched_tokens=512, block_size=16, num_kv_blocks=512)
    cfg.update(kw)
    return LLMEngine(tiny, EngineConfig(**cfg))


def random_prompts(n: int, seed: int, lo: int = 1, hi: int = 120, vocab: int = 1024) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def recompute_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Reference: every token from a full forward over the whole sequence, no cache."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model.forward_dense(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt) :]


def assert_idle_and_leak_free(engine: LLMEngine) -> None:
    s = engine.stats()
    assert (s.num_running, s.num_waiting) == (0, 0)
    assert s.num_free_blocks == s.num_total_blocks
    assert s.kv_cache_usage == 0.0
    assert not engine.has_unfinished_requests()
    engine.block_manager.check_invariants()


def test_kv_cache_decode_equals_full_recompute(tiny):
    engine = make_engine(tiny)
    for prompt in random_prompts(3, seed=1, lo=5, hi=60):
        got = engine.generate([prompt], SamplingParams(max_tokens=24, ignore_eos=True))[0]
        assert got == recompute_greedy(tiny.model, prompt, 24)
    assert_idle_and_leak_free(engine)


def test_kv_cache_logits_match_recompute(tiny):
    """The paged path's logits for a decode step equal a dense forward's (float tolerance)."""
    engine = make_engine(tiny)
    prompt = random_prompts(1, seed=2, lo=40, hi=40)[0]
    out = engine.generate([prompt], SamplingParams(max_tokens=5, ignore_eos=True))[0]
    full = prompt + out
    dense = tiny.model.forward_dense(torch.tensor([full]))[0]
    # Run prompt + 4 outputs through the engine's paged path as prefill, then compare the last logits.
    seq_engine = make_engine(tiny, max_num_batched_tokens=7)  # chunks of 7: prefill reads cached context
    seq_engine.add_request("r", full[:-1], SamplingParams(max_tokens=1, ignore_eos=True))
    captured = {}
    orig = seq_engine.runner.model.compute_logits

    def spy(hidden):
        logits = orig(hidden)
        captured["logits"] = logits
        return logits

    seq_engine.runner.model.compute_logits = spy
    try:
        while seq_engine.has_unfinished_requests():
            seq_engine.step()
    finally:
        seq_engine.runner.model.compute_logits = orig
    torch.testing.assert_close(captured["logits"][0], dense[-2], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("concurrency", [1, 8, 32])
def test_concurrent_requests_equal_alone(tiny, concurrency):
    prompts = random_prompts(concurrency, seed=10 + concurrency, lo=1, hi=150)
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    alone_engine = make_engine(tiny, enable_prefix_caching=False)
    alone = [alone_engine.generate([p], params)[0] for p in prompts]
    engine = make_engine(tiny, enable_prefix_caching=False)
    together = engine.generate(prompts, params)
    assert together == alone
    assert len({tuple(o) for o in together}) > 1 or concurrency == 1  # not a degenerate model
    assert_idle_and_leak_free(engine)


def test_decode_groups_split_where_padding_would_exceed_half():
    # Sorted longest first; a new group starts at <= half the group's longest, at most max_groups.
    assert decode_groups([10, 9, 5, 5, 4, 1]) == [(0, 2), (2, 3), (5, 1)]
    assert decode_groups([7, 7, 6]) == [(0, 3)]
    assert decode_groups([64, 32, 16, 8, 4, 2], max_groups=3) == [(0, 1), (1, 1), (2, 4)]
    assert decode_groups([]) == []


def test_decodes_of_very_different_lengths_in_groups_equal_alone(tiny, monkeypatch):
    """One long sequence decoding beside short ones: the decodes run in several groups, same tokens."""
    import preheat_server.engine.model_runner as mr

    seen: list[list[tuple[int, int]]] = []

    def spy(num_blocks, max_groups=4):
        groups = decode_groups(num_blocks, max_groups)
        seen.append(groups)
        return groups

    monkeypatch.setattr(mr, "decode_groups", spy)
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 1024) for _ in range(n)] for n in (400, 3, 20, 150, 40, 9, 70)]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    alone = [make_engine(tiny, enable_prefix_caching=False).generate([p], params)[0] for p in prompts]
    engine = make_engine(tiny, enable_prefix_caching=False)
    assert engine.generate(prompts, params) == alone
    assert max(len(g) for g in seen) >= 3  # the long, middle and short sequences were split
    assert_idle_and_leak_free(engine)


def test_requests_join_and_leave_every_step(tiny):
    """Staggered arrivals and different lengths: outputs still equal each request alone."""
    prompts = random_prompts(12, seed=5, lo=3, hi=90)
    lengths = [3 + (i * 5) % 17 for i in range(12)]
    ref_engine = make_engine(tiny)
    alone = [ref_engine.generate([p], SamplingParams(max_tokens=n, ignore_eos=True))[0]
             for p, n in zip(prompts, lengths, strict=True)]
    engine = make_engine(tiny, max_num_batched_tokens=64)
    got: dict[str, list[int]] = {}
    batch_sizes = set()
    for i, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=n, ignore_eos=True))
        for out in engine.step():  # one step per arrival: requests join a running batch
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
        batch_sizes.add(engine.stats().last_batch_size)
    while engine.has_unfinished_requests():
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert [got[f"r{i}"] for i in range(12)] == alone
    assert len(batch_sizes) > 1
    assert_idle_and_leak_free(engine)


def test_chunked_prefill_equals_unchunked(tiny):
    prompts = random_prompts(4, seed=3, lo=100, hi=300)
    unchunked = make_engine(tiny, max_num_batched_tokens=1024).generate(prompts, GREEDY)
    engine = make_engine(tiny, max_num_batched_tokens=24)
    chunked = engine.generate(prompts, GREEDY)
    assert chunked == unchunked
    assert engine.stats().last_batch_tokens <= 24
    assert_idle_and_leak_free(engine)


def test_prefix_cache_hit_gives_identical_output(tiny):
    shared = random_prompts(1, seed=4, lo=80, hi=80)[0]
    a, b = [*shared, 5, 6, 7], [*shared, 9, 10]
    no_cache = make_engine(tiny, enable_prefix_caching=False)
    ref = [no_cache.generate([p], GREEDY)[0] for p in (a, b)]
    engine = make_engine(tiny)
    outs = {}
    for rid, p in (("a", a), ("b", b)):
        engine.add_request(rid, p, GREEDY)
        toks = []
        while engine.has_unfinished_requests():
            for o in engine.step():
                toks.extend(o.new_token_ids)
                if o.finished:
                    outs[rid] = (toks, o.num_cached_tokens)
    assert [outs["a"][0], outs["b"][0]] == ref
    assert outs["a"][1] == 0
    assert outs["b"][1] == (80 // 16) * 16  # the shared full blocks came from the cache
    s = engine.stats()
    assert s.prefix_cache_hits == outs["b"][1]
    assert s.prefix_cache_queries == len(a) + len(b)
    assert_idle_and_leak_free(engine)


def test_fully_cached_prompt_still_computes_a_token(tiny):
    prompt = random_prompts(1, seed=6, lo=64, hi=64)[0]  # exactly 4 blocks
    engine = make_engine(tiny)
    first = engine.generate([prompt], GREEDY)[0]
    engine.add_request("again", prompt, GREEDY)
    outs = []
    computed_tokens = []
    while engine.has_unfinished_requests():
        outs.extend(engine.step())
        computed_tokens.append(engine.stats().last_batch_tokens)
    toks = [t for o in outs for t in o.new_token_ids]
    assert toks == first
    final = outs[-1]
    # All but the last block hit; the model still ran over ≥1 prompt token to produce the first output.
    assert final.num_cached_tokens == 48
    assert computed_tokens[0] >= 1
    assert_idle_and_leak_free(engine)


def test_prefix_cache_evicts_lru_blocks_when_full(tiny):
    engine = make_engine(tiny, num_kv_blocks=12)  # 192 tokens of KV
    prompts = random_prompts(6, seed=7, lo=64, hi=64)
    ref = make_engine(tiny, enable_prefix_caching=False)
    for p in prompts:
        assert engine.generate([p], GREEDY)[0] == ref.generate([p], GREEDY)[0]
    # Cached blocks were reused for new content: the hash map never exceeds the cache.
    assert len(engine.block_manager.hash_to_block) <= 12
    assert_idle_and_leak_free(engine)


def test_abort_frees_blocks_at_once_and_reports(tiny):
    engine = make_engine(tiny)
    prompts = random_prompts(4, seed=8, lo=30, hi=60)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    engine.step()
    used = engine.stats().num_total_blocks - engine.stats().num_free_blocks
    assert used > 0
    engine.abort_request("r0")
    engine.abort_request("r3")
    engine.abort_request("no-such-request")  # ignored
    after = engine.stats()
    assert after.num_running == 2
    assert after.num_total_blocks - after.num_free_blocks < used
    finals = [o for o in engine.step() if o.finished]
    assert {o.request_id for o in finals if o.finish_reason == "abort"} == {"r0", "r3"}
    engine.abort_request("r1")
    engine.abort_request("r2")
    engine.add_request("queued", prompts[0], GREEDY)
    engine.abort_request("queued")  # aborted while still waiting
    outs = engine.step()
    assert {o.request_id for o in outs} == {"r1", "r2", "queued"}
    assert all(o.finished and o.finish_reason == "abort" for o in outs)
    assert_idle_and_leak_free(engine)


def test_preemption_by_recompute_keeps_outputs_and_leaks_nothing(tiny):
    prompts = random_prompts(8, seed=9, lo=20, hi=40)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    ref_engine = make_engine(tiny)
    alone = [ref_engine.generate([p], params)[0] for p in prompts]
    # 16 blocks × 16 tokens cannot hold 8 sequences of up to 80 tokens: preemption is forced.
    engine = make_engine(tiny, num_kv_blocks=16)
    got = engine.generate(prompts, params)
    assert engine.stats().num_preemptions > 0
    assert got == alone
    assert_idle_and_leak_free(engine)


def test_sequence_larger_than_whole_cache_finishes_with_length(tiny):
    engine = make_engine(tiny, num_kv_blocks=2)  # 32 tokens in all
    engine.add_request("big", list(range(3, 23)), SamplingParams(max_tokens=100, ignore_eos=True))
    outs = []
    while engine.has_unfinished_requests():
        outs.extend(engine.step())
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert 0 < outs[-1].num_output_tokens < 100
    assert_idle_and_leak_free(engine)


def test_counters_add_up(tiny):
    engine = make_engine(tiny, max_num_batched_tokens=40)
    prompts = random_prompts(10, seed=11, lo=1, hi=100)
    max_tokens = [1 + i % 7 for i in range(10)]
    for i, (p, n) in enumerate(zip(prompts, max_tokens, strict=True)):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=n, ignore_eos=True))
    prompt_total, gen_total, finals = 0, 0, {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            gen_total += len(o.new_token_ids)
            if o.finished:
                finals[o.request_id] = o
                prompt_total += o.num_prompt_tokens
    assert prompt_total == sum(len(p) for p in prompts)
    assert engine.stats().num_prompt_tokens_total == prompt_total
    assert gen_total == sum(max_tokens) == engine.stats().num_generation_tokens_total
    assert all(finals[f"r{i}"].num_output_tokens == max_tokens[i] for i in range(10))
    assert all(o.finish_reason == "length" for o in finals.values())
    assert_idle_and_leak_free(engine)


def test_stop_tokens_and_eos_finish_with_stop(tiny):
    engine = make_engine(tiny)
    prompt = random_prompts(1, seed=12, lo=20, hi=20)[0]
    free_run = engine.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    stop_at = free_run[3]
    engine.add_request("s", prompt, SamplingParams(max_tokens=8, stop_token_ids=(stop_at,), ignore_eos=True))
    outs = []
    while engine.has_unfinished_requests():
        outs.extend(engine.step())
    toks = [t for o in outs for t in o.new_token_ids]
    assert toks == free_run[: free_run.index(stop_at) + 1]
    assert outs[-1].finish_reason == "stop"
    # EOS: the tiny model's end-of-text id ends generation unless ignore_eos.
    eos = tiny.config.eos_token_id
    assert eos in tiny.config.eos_token_ids
    seq_stop = engine._stop_reason  # the rule itself, on a fabricated step
    from preheat_server.engine.sequence import Sequence

    s = Sequence("x", [5], SamplingParams(max_tokens=5), 0)
    s.token_ids.append(eos)
    assert seq_stop(s, eos) == "stop"
    s2 = Sequence("y", [5], SamplingParams(max_tokens=5, ignore_eos=True), 0)
    s2.token_ids.append(eos)
    assert seq_stop(s2, eos) is None


def test_seeded_sampling_is_reproducible(tiny):
    engine = make_engine(tiny)
    prompt = random_prompts(1, seed=14, lo=10, hi=10)[0]
    p = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, top_k=50, seed=42, ignore_eos=True)
    a = engine.generate([prompt], p)[0]
    b = engine.generate([prompt, prompt], p)
    assert b == [a, a]
    other = engine.generate([prompt], SamplingParams(max_tokens=20, temperature=1.0, seed=7, ignore_eos=True))[0]
    assert other != a
    assert_idle_and_leak_free(engine)


@pytest.mark.parametrize(
    ("prompt", "params", "match"),
    [
        ([], SamplingParams(), "empty"),
        ([5] * 1030, SamplingParams(), "context"),
        ([5, 99999], SamplingParams(), "token ids"),
        ([5], SamplingParams(max_tokens=0), "max_tokens"),
        ([5], SamplingParams(temperature=-1.0), "temperature"),
        ([5], SamplingParams(top_p=0.0), "top_p"),
        ([5], SamplingParams(top_k=-2), "top_k"),
    ],
)
def test_bad_requests_raise_value_error(tiny, prompt, params, match):
    engine = make_engine(tiny, num_kv_blocks=8)
    with pytest.raises(ValueError, match=match):
        engine.add_request("bad", prompt, params)
    assert_idle_and_leak_free(engine)


def test_duplicate_and_oversized_requests_rejected(tiny):
    engine = make_engine(tiny, num_kv_blocks=4)
    engine.add_request("a", [5, 6], GREEDY)
    with pytest.raises(ValueError, match="already"):
        engine.add_request("a", [5, 6], GREEDY)
    with pytest.raises(ValueError, match="KV cache"):
        engine.add_request("b", list(range(3, 200)), GREEDY)
    engine.abort_request("a")
    engine.step()
    assert_idle_and_leak_free(engine)


def test_itl_controller_caps_batch_growth():
    itl = ItlController(target_ms=50.0, max_num_seqs=32)
    for _ in range(5):
        itl.observe(0.200, batch_size=32)  # 4× over the target
    assert itl.cap <= 10
    for _ in range(200):
        itl.observe(0.010, batch_size=itl.cap)  # far under: grows back one at a time
    assert itl.cap == 32
    off = ItlController(target_ms=None, max_num_seqs=8)
    off.observe(10.0, batch_size=8)
    assert off.cap == 8


def test_itl_cap_limits_running_sequences(tiny):
    engine = make_engine(tiny, target_itl_ms=1000.0)
    engine.itl.cap = 3  # as if steps had been measured too slow
    engine.itl.observe = lambda *a, **k: None  # freeze the cap for this test
    for i, p in enumerate(random_prompts(8, seed=14, lo=5, hi=10)):
        engine.add_request(f"r{i}", p, GREEDY)
    engine.step()
    s = engine.stats()
    assert (s.num_running, s.num_waiting, s.max_running_cap) == (3, 5, 3)
    while engine.has_unfinished_requests():
        engine.step()
        assert engine.stats().num_running <= 3
    assert_idle_and_leak_free(engine)


def test_min_step_ms_paces_busy_steps_only_and_keeps_the_tokens(tiny):
    """The emulated accelerator step: every step that runs a batch lasts at least the floor, an idle
    step does not sleep, and the tokens are those of the unpaced engine."""
    prompts = random_prompts(3, seed=21, lo=3, hi=8)
    paced = make_engine(tiny, min_step_ms=40.0)
    assert paced.step() == [] and paced.stats().last_step_seconds == 0.0  # idle: no sleep
    for i, p in enumerate(prompts):
        paced.add_request(f"p{i}", p, GREEDY)
    steps = []
    while paced.has_unfinished_requests():
        paced.step()
        steps.append(paced.stats().last_step_seconds)
    assert steps and min(steps) >= 0.040
    assert paced.generate(prompts, GREEDY) == make_engine(tiny).generate(prompts, GREEDY)
    with pytest.raises(ValueError, match="min_step_ms"):
        make_engine(tiny, min_step_ms=-1.0)
