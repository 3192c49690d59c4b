"""Delta codec: bit-exact round trips, C++ kernel == torch path (identical bytes), byte bounds, bad input; for
each record format (gap8, rice, rice_classes)."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from searchr1.weightsync import codec, rice, stream

IMPLS = ["torch", "cpp"] if codec.kernel() is not None else ["torch"]
RICE = ["rice", "rice_classes"]
CPU = torch.device("cpu")
# Bit patterns that a float compare would get wrong: -0.0, NaNs with payloads, subnormals, infinities.
SPECIAL = [0x0000, 0x8000, 0x7FC0, 0x7FC1, 0xFFFF, 0x7F81, 0x0001, 0x8001, 0x007F, 0x7F80, 0xFF80]


def _i16(vals) -> torch.Tensor:
    return torch.tensor([v - 65536 if v >= 32768 else v for v in vals], dtype=torch.int16)


def roundtrip(old_n, new_n, *, capacity=1 << 16, impl="auto", full_ids=(), pub=True, fmt="gap8", sent=None):
    """Encode new against old (as the publisher's copy) into frames, apply them to a copy of old; returns
    (receiver tensor, publisher copy, stats, frames). `sent` collects (records, payload) of every frame."""
    published = old_n.clone() if pub else None
    recv = old_n.clone()
    window = codec.window_size(capacity, fmt)
    writer = codec.FrameWriter(capacity, CPU)
    stats = stream.StreamStats.empty(1)
    frames = 0
    for last in stream.encode_stream([new_n], None if published is None else [published], [0], set(full_ids),
                                    writer, window, codec.Scratch(window, CPU, fmt), stats, impl, fmt):
        records, used, is_last, n_t = codec.parse_header(writer.header(last, 1))
        assert is_last == last and n_t == 1 and used == writer.used
        payload = writer.bucket[:used].clone()
        if sent is not None:
            sent.append((records, payload))
        codec.apply_frame(records, payload, [recv], impl)
        writer.reset()
        frames += 1
    return recv, published, stats, frames


def rice_header(words: torch.Tensor) -> dict:
    """The fields of a RICE record's header (rice.py documents the layout)."""
    h = (words[:rice.HEAD].to(torch.int64) & 0xFFFFFFFF).tolist()
    return {"T": h[0] & 0xFF, "kS": (h[0] >> 16) & 0xFF, "kL": h[0] >> 24, "n_s": h[1], "eg_s": (h[2] >> 24) & 1,
            "eg_l": (h[2] >> 25) & 1, "mz": h[3]}


def rice_records(sent) -> list[tuple[list[int], dict]]:
    out = []
    for records, payload in sent:
        o = 0
        for rec in records:
            size = {codec.RICE: rec[5], codec.FULL: codec.full_window_nbytes(rec[3])}.get(rec[1], None)
            if rec[1] == codec.RICE:
                out.append((rec, rice_header(payload[o:o + size].view(torch.int32))))
            o += size if size is not None else (4 * rec[5] + 3 * rec[4] + 3) & ~3
    return out


def assert_impls_agree(old, new, fmt, **kw):
    """Every impl reproduces `new` on the receiver and in the publisher's copy, with identical frames."""
    results = []
    for impl in IMPLS:
        sent = []
        recv, pub, stats, _ = roundtrip(old, new, impl=impl, fmt=fmt, sent=sent, **kw)
        assert torch.equal(recv, new) and torch.equal(pub, new), impl
        assert stats.count[0] == int((old != new).sum())
        assert stats.digest[0] == codec.digest(new, impl="torch")
        results.append(sent)
    for other in results[1:]:
        assert len(other) == len(results[0])
        for (ra, pa), (rb, pb) in zip(results[0], other):
            assert ra == rb and torch.equal(pa, pb)  # the C++ kernel and the torch path write the same bytes
    return results[0]


@pytest.mark.parametrize("impl", IMPLS)
def test_special_bit_patterns_roundtrip(impl):
    old = _i16(SPECIAL * 7)
    new = _i16(list(reversed(SPECIAL)) * 7)
    recv, pub, stats, _ = roundtrip(old, new, impl=impl)
    assert torch.equal(recv, new) and torch.equal(pub, new)
    assert stats.count[0] == int((old != new).sum())
    assert stats.digest[0] == codec.digest(new, impl="torch")


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000), frac=st.sampled_from([0.0, 0.001, 0.02, 0.3, 1.0]), seed=st.integers(0, 2**31 - 1),
       capacity=st.sampled_from([64, 1000, 1 << 16]), special=st.booleans())
def test_property_roundtrip_and_impls_agree(n, frac, seed, capacity, special):
    g = torch.Generator().manual_seed(seed)
    old = torch.randint(-32768, 32768, (n,), generator=g, dtype=torch.int32).to(torch.int16)
    if special and n:
        pick = torch.randint(0, len(SPECIAL), (n,), generator=g)
        old = torch.where(torch.rand(n, generator=g) < 0.5, _i16(SPECIAL)[pick], old)
    change = torch.rand(n, generator=g) < frac
    new = torch.where(change, torch.randint(-32768, 32768, (n,), generator=g, dtype=torch.int32).to(torch.int16), old)
    results = [roundtrip(old, new, capacity=capacity, impl=impl) for impl in IMPLS]
    for recv, pub, stats, _ in results:
        assert torch.equal(recv, new) and torch.equal(pub, new)
        assert stats.count[0] == int((old != new).sum())
        assert stats.digest[0] == codec.digest(new, impl="torch")
    assert all(r[2] == results[0][2] for r in results)


@pytest.mark.parametrize("impl", IMPLS)
def test_window_bytes_equal_across_impls_and_gaps_escape(impl):
    n = 100_000
    old = torch.zeros(n, dtype=torch.int16)
    new = old.clone()
    idx = torch.tensor([0, 1, 255, 256, 511, 512 + 256, 40_000, n - 1])  # gaps of 1, 254, 255, 256, long
    new[idx] = _i16([0x8000, 0x7FC1, 1, 2, 3, 4, 5, 0xFFFF])
    sc_t, sc = codec.Scratch(n, CPU), codec.Scratch(n, CPU)
    ref = codec.encode_window(new, old.clone(), sc_t, 7, "torch")
    got = codec.encode_window(new, old.clone(), sc, 7, impl)
    assert (got.count, got.n_esc, got.digest) == (ref.count, ref.n_esc, ref.digest) == (8, 3, got.digest)
    assert torch.equal(got.gaps, ref.gaps) and torch.equal(got.esc, ref.esc) and torch.equal(got.vals, ref.vals)
    dst = old.clone()
    version = dst._version
    codec.apply_window(dst, got.gaps, got.esc, got.vals, impl)
    assert torch.equal(dst, new)
    assert dst._version > version  # engines detect weight writes by the version counter


@pytest.mark.parametrize("impl", IMPLS)
def test_digest_impls_agree_and_detect_swaps(impl):
    x = torch.randint(-32768, 32768, (12_345,), dtype=torch.int32).to(torch.int16)
    assert codec.digest(x, 99, impl) == codec.digest(x, 99, "torch")
    big = 2**40 + 12_345  # wraps mod 2^64: both paths must wrap the same way
    assert codec.digest(x, big, impl) == codec.digest(x, big, "torch")
    assert codec.add_digest(codec.digest(x[:777], big, impl), codec.digest(x[777:], big + 777, impl)) == \
        codec.digest(x, big, "torch")
    assert codec.add_digest(codec.digest(x[:5000], 0, impl), codec.digest(x[5000:], 5000, impl)) == codec.digest(x)
    y = x.clone()
    y[[3, 7]] = y[[7, 3]]
    assert (x[3] == x[7]) or codec.digest(y, 0, impl) != codec.digest(x, 0, impl)


def test_empty_delta_sends_nothing_and_full_delta_sends_tensor():
    x = torch.randint(-32768, 32768, (5000,), dtype=torch.int32).to(torch.int16)
    recv, _, stats, _ = roundtrip(x, x.clone())
    assert torch.equal(recv, x) and stats.kind == [0] and stats.count == [0]
    y = x ^ 1  # every element changes: the delta (3 bytes/element) is larger than the tensor
    recv, _, stats, _ = roundtrip(x, y)
    assert torch.equal(recv, y) and stats.count == [5000]


def test_delta_larger_than_full_goes_whole():
    x = torch.zeros(4000, dtype=torch.int16)
    writer = codec.FrameWriter(1 << 16, CPU)
    stats = stream.StreamStats.empty(1)
    w = codec.window_size(1 << 16)
    list(stream.encode_stream([x + 1], [x.clone()], [0], set(), writer, w, codec.Scratch(w, CPU), stats))
    assert [r[1] for r in writer.records] == [codec.FULL] and writer.used == 8000


def test_chunked_windows_and_multiple_frames():
    # A small bucket stands in for parameters over 2^31 elements: every window is an independent chunk.
    old = torch.randint(-32768, 32768, (50_000,), dtype=torch.int32).to(torch.int16)
    new = old.clone()
    new[::5] += 1
    recv, _, stats, frames = roundtrip(old, new, capacity=4096)
    assert torch.equal(recv, new) and frames > 1 and stats.count == [int((old != new).sum())]


def test_full_export_without_published_copy():
    old = torch.zeros(3000, dtype=torch.int16)
    new = torch.arange(3000, dtype=torch.int16)
    recv, _, stats, _ = roundtrip(old, new, pub=False, capacity=1000)
    assert torch.equal(recv, new) and stats.kind == [codec.FULL]


def test_bytes_per_changed_element_under_six():
    torch.manual_seed(0)
    w = torch.randn(2_000_000) * 0.02
    old = w.bfloat16()
    new = (w - 1e-6 * torch.randn(2_000_000).sign()).bfloat16()
    writer = codec.FrameWriter(64 << 20, CPU)
    stats = stream.StreamStats.empty(1)
    win = codec.window_size(64 << 20)
    list(stream.encode_stream([codec.bits(new)], [codec.bits(old).clone()], [0], set(), writer, win,
                             codec.Scratch(win, CPU), stats))
    assert 0 < stats.count[0] < 2_000_000 * 0.2
    assert writer.used <= 6 * stats.count[0] + 4
    assert writer.used <= 3.2 * stats.count[0]  # one byte of gap per change at this sparsity


@pytest.mark.parametrize("impl", IMPLS)
def test_adam_like_steps_bit_exact(impl):
    torch.manual_seed(1)
    shapes = [(64, 48), (48,), (3, 5, 7), (0,), (1,)]
    master = [torch.randn(s) * 0.02 for s in shapes]
    m = [torch.zeros(s) for s in shapes]
    v = [torch.zeros(s) for s in shapes]
    published = [torch.empty(s, dtype=torch.bfloat16) for s in shapes]
    recv = [torch.full(s, float("nan"), dtype=torch.bfloat16) for s in shapes]
    writer = codec.FrameWriter(2048, CPU)
    win = codec.window_size(2048)
    scratch = codec.Scratch(win, CPU)
    for step in range(12):
        new = [p.bfloat16() for p in master]
        ids = list(range(len(shapes)))
        stats = stream.StreamStats.empty(len(shapes))
        full = set(ids) if step == 0 else set()
        for last in stream.encode_stream([codec.bits(t) for t in new], [codec.bits(t) for t in published], ids,
                                        full, writer, win, scratch, stats, impl):
            records, used, _, _ = codec.parse_header(writer.header(last, len(ids)))
            codec.apply_frame(records, writer.bucket[:used], [codec.bits(t) for t in recv], impl)
            writer.reset()
        for t_new, t_recv, t_pub in zip(new, recv, published):
            assert torch.equal(codec.bits(t_new), codec.bits(t_recv)) and torch.equal(codec.bits(t_pub), codec.bits(t_new))
        for p, mm, vv in zip(master, m, v):
            grad = torch.randn_like(p)
            mm.mul_(0.9).add_(grad, alpha=0.1)
            vv.mul_(0.999).addcmul_(grad, grad, value=0.001)
            p.sub_(1e-3 * mm / (vv.sqrt() + 1e-8))


def test_bad_records_name_the_tensor():
    targets = [torch.zeros(10, dtype=torch.int16)]
    with pytest.raises(ValueError, match="layer.w"):
        codec.apply_frame([[0, codec.FULL, 8, 5, 5, 0]], torch.zeros(16, dtype=torch.uint8), targets,
                          names=["layer.w"])
    with pytest.raises(ValueError, match="tensor id 3"):
        codec.apply_frame([[3, codec.FULL, 0, 1, 1, 0]], torch.zeros(4, dtype=torch.uint8), targets)
    with pytest.raises((ValueError, RuntimeError), match="outside the window"):
        gaps = torch.tensor([5, 9], dtype=torch.uint8)
        codec.apply_window(targets[0], gaps, torch.zeros(0, dtype=torch.int32), torch.zeros(2, dtype=torch.int16),
                           "cpp" if "cpp" in IMPLS else "torch")
    with pytest.raises(TypeError, match="bfloat16"):
        codec.bits(torch.zeros(3))


# ---------------------------------------------------------------- rice, rice_classes

def _adam_step(n: int, lr: float, seed: int = 0, zeros: float = 0.0):
    """bf16 bits before/after one Adam-like step of fp32 masters ~N(0, 0.02) (a fraction `zeros` exactly 0)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, generator=g) * 0.02
    w[torch.rand(n, generator=g) < zeros] = 0.0
    step = lr * torch.randn(n, generator=g).clamp(-3, 3)
    return codec.bits(w.bfloat16()).clone(), codec.bits((w - step).bfloat16()).clone()


@pytest.mark.parametrize("fmt", RICE)
def test_rice_special_bit_patterns_roundtrip(fmt):
    # +0 <-> -0, NaN payloads, infinities, subnormals, into and out of each other, repeated; and zeros changing
    # to every pattern (the zero-class code, its escapes above the reference magnitude)
    old = _i16(SPECIAL * 40 + [0x0000] * len(SPECIAL) + [0x8000] * len(SPECIAL))
    new = _i16(list(reversed(SPECIAL)) * 40 + SPECIAL + SPECIAL)
    assert_impls_agree(old, new, fmt)
    flips = _i16([0x0000, 0x8000] * 500)
    assert_impls_agree(flips, _i16([0x8000, 0x0000] * 500), fmt)  # every element a +0/-0 flip
    nan = _i16([0x7FC1, 0xFFC0, 0x7F81] * 300)
    assert_impls_agree(nan, nan ^ 1, fmt)  # NaN payloads changed by one bit, and a NaN into a signalling NaN


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 5000), frac=st.sampled_from([0.0, 0.001, 0.02, 0.3, 1.0]), seed=st.integers(0, 2**31 - 1),
       capacity=st.sampled_from([512, 4096, 1 << 16]), special=st.booleans(), small=st.booleans(),
       fmt=st.sampled_from(RICE))
def test_rice_property_roundtrip_and_identical_bytes(n, frac, seed, capacity, special, small, fmt):
    g = torch.Generator().manual_seed(seed)
    old = torch.randint(-32768, 32768, (n,), generator=g, dtype=torch.int32).to(torch.int16)
    if special and n:
        pick = torch.randint(0, len(SPECIAL), (n,), generator=g)
        old = torch.where(torch.rand(n, generator=g) < 0.5, _i16(SPECIAL)[pick], old)
    change = torch.rand(n, generator=g) < frac
    step = torch.randint(-3, 4, (n,), generator=g, dtype=torch.int32) if small else \
        torch.randint(-32768, 32768, (n,), generator=g, dtype=torch.int32)
    new = torch.where(change, (old.to(torch.int32) + step).to(torch.int16), old)
    assert_impls_agree(old, new, fmt, capacity=capacity)


@pytest.mark.parametrize("fmt", RICE)
def test_rice_adam_steps_bytes_and_both_gap_codes(fmt):
    old, new = _adam_step(300_000, 1e-6, zeros=0.002)
    sent = assert_impls_agree(old, new, fmt, capacity=16 << 20)
    heads = rice_records(sent)
    payload = sum(r[5] for r, _ in heads)
    changed = int((old != new).sum())
    assert 0.002 < changed / old.numel() < 0.05
    assert payload / changed < (1.2 if fmt == "rice_classes" else 1.5)  # gap8 takes ~3.3 bytes here
    if fmt == "rice_classes":
        assert all(h["T"] > 0 and 0 < h["n_s"] < r[4] for r, h in heads)  # both classes in use: the walk
    else:
        assert all(h["T"] == 0 for _, h in heads)
    # changes clustered in runs with long gaps between: Exp-Golomb (long tails), escapes of Rice gaps
    old = torch.zeros(400_000, dtype=torch.int16)
    new = old.clone()
    for start in (5, 150_000, 390_000):
        new[start:start + 3000:2] = _i16([0x3586, 0xB586] * 750)
    sent = assert_impls_agree(old, new, fmt, capacity=16 << 20)
    assert any(h["eg_l"] or h["eg_s"] for _, h in rice_records(sent))
    one_far = old.clone()
    one_far[:4000:2] = 1
    one_far[-1] = 1  # a gap of ~396k after gaps of 1: a Rice quotient far past the cap
    assert_impls_agree(old, one_far, fmt, capacity=16 << 20)


@pytest.mark.parametrize("fmt", RICE)
def test_rice_window_tails_and_multiple_frames(fmt):
    for n in (1, 31, 32, 33, 255, 257, 8191, 70_001):  # partial groups and blocks at the window's end
        old, new = _adam_step(n, 3e-5, seed=n, zeros=0.05)
        new[-1] = old[-1] ^ 0x8000  # the last element always changes (a sign flip)
        assert_impls_agree(old, new, fmt)
    old, new = _adam_step(200_000, 1e-5, seed=3)
    sent = assert_impls_agree(old, new, fmt, capacity=1 << 14)  # small buckets: many windows and frames
    assert len(sent) > 1 and len(rice_records(sent)) > 1


@pytest.mark.parametrize("fmt", RICE)
@pytest.mark.parametrize("impl", IMPLS)
def test_rice_receiver_without_the_published_copy_never_crashes(fmt, impl):
    old, new = _adam_step(50_000, 1e-5, seed=5, zeros=0.01)
    sent = []
    roundtrip(old, new, impl=impl, fmt=fmt, sent=sent, capacity=1 << 20)
    (records, payload), = sent
    bad = old.clone()
    bad[::7] = _i16([0x7F80])  # a receiver whose weights differ (classes and value contexts shift)
    before = bad.clone()
    codec.apply_frame(records, payload, [bad], impl)  # decodes garbage at worst, in bounds, no exception
    assert not torch.equal(bad, new) and codec.digest(bad) != codec.digest(new)  # the digest catches it
    tid, kind, start, n, count, nbytes = records[0]
    words = payload[:nbytes].view(torch.int32)
    assert codec.apply_rice(old.clone(), words, count, impl) is True
    assert codec.apply_rice(before.clone(), words, count, impl) is False


@pytest.mark.parametrize("impl", IMPLS)
def test_rice_malformed_records_raise(impl):
    old, new = _adam_step(10_000, 1e-5, seed=6)
    sent = []
    roundtrip(old, new, impl=impl, fmt="rice", sent=sent)
    (records, payload), = sent
    rec = records[0]
    with pytest.raises(ValueError, match="bytes="):
        codec.apply_frame([[*rec[:5], rec[5] + 2]], payload, [old.clone()], impl)
    with pytest.raises(ValueError, match="count="):
        codec.apply_frame([[*rec[:4], rec[3] + 1, rec[5]]], payload, [old.clone()], impl)
    broken = payload.clone()
    broken.view(torch.int32)[2] = -1  # header fields out of range
    with pytest.raises((ValueError, RuntimeError), match="malformed rice header"):
        codec.apply_frame(records, broken, [old.clone()], impl)


@pytest.mark.parametrize("fmt", RICE)
def test_rice_dense_change_goes_whole_and_empty_sends_nothing(fmt):
    x = torch.randint(-32768, 32768, (5000,), dtype=torch.int32).to(torch.int16)
    recv, _, stats, _ = roundtrip(x, x.clone(), fmt=fmt)
    assert torch.equal(recv, x) and stats.kind == [0]
    sent = []
    y = torch.randint(-32768, 32768, (5000,), dtype=torch.int32).to(torch.int16)  # every element, at random
    recv, _, stats, _ = roundtrip(x, y, fmt=fmt, sent=sent)
    assert torch.equal(recv, y) and [r[1] for r in sent[0][0]] == [codec.FULL]


@pytest.mark.parametrize("impl", IMPLS)
def test_rice_apply_bumps_the_version_counter(impl):
    old, new = _adam_step(5_000, 1e-5, seed=7)
    sent = []
    roundtrip(old, new, impl=impl, fmt="rice", sent=sent)
    (records, payload), = sent
    dst = old.clone()
    version = dst._version
    codec.apply_frame(records, payload, [dst], impl)
    assert torch.equal(dst, new) and dst._version > version
