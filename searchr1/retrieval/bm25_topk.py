"""The exact top-k query kernel over bm25_scores.py's matrix: numba, cached on disk, so a process pays its compilation
once per machine, not per start. Suffixes as in bm25_scores.py (_v per term, _d per passage, _z per nonzero entry,
_qc per query and candidate).
"""
from __future__ import annotations

import numba
import numpy as np

from searchr1.retrieval.bm25_select import find, gallop, heap_push, kth, sort_unique


@numba.njit(cache=True, nogil=True)
def _exact_score(q_ids, lo_q, hi_q, d, indptr_v, doc_z, tf_z, dl, idf_v, k1, b, avgdl):
    """rank_bm25.BM25Okapi.get_scores for one passage: float64, summed in query-token order, repeats included."""
    s = 0.0
    for e in range(lo_q, hi_q):
        t = q_ids[e]
        if t < 0:
            continue
        lo, hi = indptr_v[t], indptr_v[t + 1]
        pos = find(doc_z, lo, hi, d)
        if pos < hi and doc_z[pos] == d:
            f = float(tf_z[pos])
            s += idf_v[t] * (f * (k1 + 1.0) / (f + k1 * (1.0 - b + b * dl / avgdl)))
    return s



@numba.njit(cache=True, nogil=True)
def _exact_scores(fin, n_f, ex, q_ids, lo_q, hi_q, indptr_v, doc_z, tf_z, len_d, idf_v, k1, b, avgdl):
    """_exact_score of each passage of fin[:n_f] (sorted) into ex[:n_f], query token by query token: each token's
    postings are merged with the passages (or searched from one to the next, when they are far more), where one
    search per passage and token cost ~13 probes each for a thousand candidates. The same expression, added in
    the same order, from the same 0.0: the same bits."""
    ex[:n_f] = 0.0
    for e in range(lo_q, hi_q):
        t = q_ids[e]
        if t < 0:
            continue
        lo, hi = indptr_v[t], indptr_v[t + 1]
        p = lo
        far = hi - lo > 16 * n_f
        for i in range(n_f):
            d = fin[i]
            if far:
                p = gallop(doc_z, p, hi, d)
            else:
                while p < hi and doc_z[p] < d:
                    p += 1
            if p == hi:
                break
            if doc_z[p] == d:
                f = float(tf_z[p])
                ex[i] += idf_v[t] * (f * (k1 + 1.0) / (f + k1 * (1.0 - b + b * float(len_d[d]) / avgdl)))

# top_k_exact's tuning (speed only, never results): a list shorter than max(CHECK_LEN, passages / CHECK_FRAC)
# postings is added rather than preceded by a checkpoint (measured here: on 6,880 passages no checkpoint pays,
# at 100k ~16k postings is best, at 1M ~1/8 of the passages); PROBE_WALK postings are walked for probes; while
# more than REPROBE candidates remain, the best of them are scored exactly again after each term. Each probe scores
# max(k, PROBES) passages exactly and takes their k-th best as theta: more than k make a tighter bound for small
# k (single queries, measured quiet against 8: at 100k passages top-10 +38%, top-3 -6%; at 1M top-3 +26%, top-10
# +52%; identical answers); twice k at top-1000 cost more than the tighter bound saved (100k: 64 -> 49 q/s).
CHECK_LEN, CHECK_FRAC, PROBE_WALK, REPROBE, PROBES = 16384, 8, 1024, 256, 32


@numba.njit(cache=True, nogil=True)
def _best_partial(acc, hs, hd, indptr_v, doc_z, terms, order, upto, n_docs, walk, limit, seen):
    """The len(hs) largest partial sums (a heap, see heap_push), over the passages of the postings of the first
    `upto` terms of `order`, at most `limit` postings (walk: when they are fewer than the passages), or over the
    whole accumulator. Returns how many. `seen`: all zeros, left so (a passage in several of these lists is seen
    once per list: it is marked there, and a second walk unmarks; searching the heap for it cost k per posting)."""
    n = 0
    if walk:
        for unmark in (False, True):
            left = limit
            for jj in range(upto):
                t = terms[order[jj]]
                lo = indptr_v[t]
                hi = min(indptr_v[t + 1], lo + left)
                left -= hi - lo
                for p in range(lo, hi):
                    d = doc_z[p]
                    if unmark:
                        seen[d] = 0
                    elif not seen[d]:
                        seen[d] = 1
                        v = acc[d]
                        if n < hs.shape[0] or v > hs[0]:
                            n = heap_push(hs, hd, n, v, d)
    else:
        for d in range(n_docs):
            v = acc[d]
            if v > 0 and (n < hs.shape[0] or v > hs[0]):
                n = heap_push(hs, hd, n, v, d)
    return n


class Workspace:
    """The kernel's per-passage scratch arrays, kept between calls (one per thread): allocating and zeroing them
    anew cost a single query on 1M passages more than its postings did. `acc` and `seen` are all zeros between
    calls (the kernel clears what it touched)."""

    def __init__(self):
        self.n_docs, self.extra = -1, -1
        self.acc = self.cand = self.part = self.fin = self.ex = self.seen = None

    def arrays(self, n_docs: int, extra: int) -> tuple:
        if n_docs != self.n_docs or extra > self.extra:
            self.n_docs, self.extra = n_docs, max(extra, 1025)  # room for k up to 1,024 without a regrowth
            self.acc = np.zeros(n_docs, dtype=np.float32)
            self.cand = np.empty(n_docs + self.extra, dtype=np.int32)
            self.part = np.empty(n_docs, dtype=np.float32)
            self.fin = np.empty(n_docs + self.extra, dtype=np.int64)
            self.ex = np.empty(n_docs + self.extra, dtype=np.float64)
            self.seen = np.zeros(n_docs, dtype=np.uint8)
        return self.acc, self.cand, self.part, self.fin, self.ex, self.seen


def top_k_exact(q_ptr, q_ids, indptr_v, doc_z, score_z, maxv_v, tf_z, len_d, idf_v, k1, b, avgdl, k, depth,
                check_len=-1, probe_walk=PROBE_WALK, reprobe=REPROBE, ws: Workspace | None = None, probes=-1):
    """_top_k_exact with every argument passed: numba's dispatcher resolves omitted default arguments on a slow
    path (~230 us of CPU per call, measured: more than a short query's whole search), so a call never omits any.
    `ws`: the calling thread's Workspace (None: a fresh one); probes: passages per probe (-1: max(k, PROBES))."""
    ws = Workspace() if ws is None else ws
    probes = max(k, PROBES if probes < 0 else probes)
    acc, cand, part, fin, ex, seen = ws.arrays(len(len_d), max(depth, k) + 1)
    return _top_k_exact(q_ptr, q_ids, indptr_v, doc_z, score_z, maxv_v, tf_z, len_d, idf_v, float(k1), float(b),
                        float(avgdl), int(k), int(depth), int(check_len), int(probe_walk), int(reprobe),
                        int(probes), acc, cand, part, fin, ex, seen)


@numba.njit(cache=True, nogil=True)
def _top_k_exact(q_ptr, q_ids, indptr_v, doc_z, score_z, maxv_v, tf_z, len_d, idf_v, k1, b, avgdl, k, depth,
                 check_len, probe_walk, reprobe, n_probe, acc, cand, part, fin, ex, seen):
    """Each query's k best passages (score desc, passage asc; scores > 0 only) with rank_bm25's exact scores;
    query i is q_ids[q_ptr[i]:q_ptr[i + 1]], its word ids in order (-1: unknown word, skipped).

    Term-at-a-time over the float32 matrix into a dense accumulator, shortest postings first. Before the
    first long postings list, a checkpoint: the best few partial sums are scored exactly, which bounds the
    exact k-th best score from below (theta); if theta exceeds what every remaining term together could add
    (each term's bound: w_t * its largest score), no passage not yet seen can reach the top k, and the
    remaining terms (the common words, with long postings) only update the candidates, each found by a
    galloping search in the term's postings; candidates that the remaining terms cannot lift to theta are
    dropped as the remaining bound shrinks. The candidates still in reach at the end are rescored exactly.
    The scatter into the accumulator does nothing else (any per-posting bookkeeping would double its cost):
    checkpoints and the final reset re-walk the short lists already added, or pass over the accumulator.

    Comparisons allow for float32 rounding: a sum of m products of float32 scores is within mu = (m + 2) 2^-22
    (4x the bound) of its exact value, and term bounds are inflated by 2^-20, so a dropped passage provably
    scores below the exact k-th: the result is rank_bm25's, not an approximation of it.
    `depth`: at least this many of the best float32 candidates are rescored, even when fewer are in reach;
    check_len (-1: max(CHECK_LEN, passages // CHECK_FRAC)), probe_walk, reprobe, n_probe (>= k): see CHECK_LEN.
    acc, cand, part, fin, ex, seen: Workspace.arrays (acc and seen all zeros; the best few are added to a walk's
    candidates before duplicates are removed, hence the extra max(depth, k) + 1 entries of cand, fin and ex)."""
    n_q = len(q_ptr) - 1
    n_docs = len(len_d)
    if check_len < 0:
        check_len = max(CHECK_LEN, n_docs // CHECK_FRAC)
    out_pid = np.full((n_q, k), -1, dtype=np.int64)
    out_score = np.zeros((n_q, k), dtype=np.float64)
    m_max = 1
    for qi in range(n_q):
        m_max = max(m_max, q_ptr[qi + 1] - q_ptr[qi])
    terms = np.empty(m_max, dtype=np.int64)
    order = np.empty(m_max, dtype=np.int64)
    w_t = np.empty(m_max, dtype=np.float32)
    bound = np.empty(m_max, dtype=np.float64)
    df = np.empty(m_max, dtype=np.int64)
    rest = np.empty(m_max, dtype=np.float64)
    tail = np.empty(m_max + 1, dtype=np.int64)
    kth_buf = np.empty(k, dtype=np.float64)
    ps = np.empty(n_probe, dtype=np.float32)
    pd = np.empty(n_probe, dtype=np.int64)
    pe = np.empty(n_probe, dtype=np.float64)
    hs = np.empty(max(depth, k, 1), dtype=np.float32)
    hd = np.empty(max(depth, k, 1), dtype=np.int64)
    for qi in range(n_q):
        lo_q, hi_q = q_ptr[qi], q_ptr[qi + 1]
        m = 0
        for e in range(lo_q, hi_q):
            m += q_ids[e] >= 0
        if m == 0:
            continue
        mu = (m + 2) * 2.0 ** -22
        # distinct terms, weighted by their count in the query (queries are short: insertion sorts, no allocation)
        nt = 0
        for e in range(lo_q, hi_q):
            t = q_ids[e]
            if t < 0:  # a word the index does not know
                continue
            j = 0
            while j < nt and terms[j] != t:
                j += 1
            if j < nt:
                w_t[j] += 1.0
            else:
                terms[nt] = t
                w_t[nt] = 1.0
                nt += 1
        for j in range(nt):
            bound[j] = float(w_t[j]) * float(maxv_v[terms[j]]) * (1.0 + 2.0 ** -20)
            df[j] = indptr_v[terms[j] + 1] - indptr_v[terms[j]]
        # shortest postings first: the rare words build the best sums before the long lists of common words
        # (whose bound is not small: rank_bm25 floors negative idf at epsilon x the mean idf) are reached
        for j in range(nt):
            order[j] = j
            i = j
            while i > 0 and df[order[i - 1]] > df[j]:
                order[i] = order[i - 1]
                i -= 1
            order[i] = j
        rest[nt - 1] = 0.0  # what the terms after position jj of the order can still add
        tail[nt] = 0  # postings from position jj of the order on
        tail[nt - 1] = df[order[nt - 1]]
        for jj in range(nt - 2, -1, -1):
            rest[jj] = rest[jj + 1] + bound[order[jj + 1]]
            tail[jj] = tail[jj + 1] + df[order[jj]]
        added = 0  # postings added in full so far
        n_or = nt  # terms added in full (the first n_or of the order)
        n_c = -1  # candidates (sorted by passage) once no unseen passage can enter; -1: not yet
        theta = -1.0  # a lower bound of the exact k-th best score
        checked = 0  # `added` at the last checkpoint
        for jj in range(nt):
            t = terms[order[jj]]
            w = w_t[order[jj]]
            lo, hi = indptr_v[t], indptr_v[t + 1]
            if n_c < 0 and jj > 0 and hi - lo >= check_len and 2 * added >= 3 * checked:
                # checkpoint before a long list (and after half as much again has been added as at the last
                # one): may passages not seen yet still reach the top k? Probes: the best partial sums among the
                # shortest lists' passages (any probe gives a valid lower bound)
                checked = added
                walk = added < n_docs
                n_p = _best_partial(acc, ps, pd, indptr_v, doc_z, terms, order, jj, n_docs, walk, probe_walk, seen)
                for i in range(n_p):
                    pe[i] = _exact_score(q_ids, lo_q, hi_q, pd[i], indptr_v, doc_z, tf_z, float(len_d[pd[i]]),
                                         idf_v, k1, b, avgdl)
                theta = max(theta, kth(pe, n_p, kth_buf))
                if theta > rest[jj - 1]:
                    n_or = jj
                    n_c = 0
                    if walk:  # the passages of the short lists, deduplicated through the sort
                        for j2 in range(jj):
                            t2 = terms[order[j2]]
                            for p in range(indptr_v[t2], indptr_v[t2 + 1]):
                                d = doc_z[p]
                                if acc[d] * (1.0 + mu) + rest[jj - 1] >= theta:
                                    cand[n_c] = d
                                    n_c += 1
                        n_c = sort_unique(cand, n_c)
                    else:
                        for d in range(n_docs):
                            if acc[d] > 0 and acc[d] * (1.0 + mu) + rest[jj - 1] >= theta:
                                cand[n_c] = d
                                n_c += 1
            if n_c < 0:
                for p in range(lo, hi):
                    d = doc_z[p]
                    acc[d] += w * score_z[p]
                added += hi - lo
            else:
                p = lo
                if hi - lo > 16 * n_c:  # few candidates in a long list: search each from where the last was
                    for i in range(n_c):
                        d = cand[i]
                        p = gallop(doc_z, p, hi, d)
                        if p == hi:
                            break
                        if doc_z[p] == d:
                            acc[d] += w * score_z[p]
                else:  # as many candidates as postings, nearly: walk both sorted lists
                    for i in range(n_c):
                        d = cand[i]
                        while p < hi and doc_z[p] < d:
                            p += 1
                        if p == hi:
                            break
                        if doc_z[p] == d:
                            acc[d] += w * score_z[p]
                # partial sums are lower bounds too; while the candidates are many, the best of them are also
                # scored exactly (a higher theta drops more); then drop what the remaining terms cannot lift
                for i in range(n_c):
                    part[i] = acc[cand[i]]
                theta = max(theta, kth(part, n_c, kth_buf) * (1.0 - mu))
                if n_c > reprobe and jj < nt - 1:
                    n_p = 0
                    for i in range(n_c):
                        if n_p < n_probe or part[i] > ps[0]:
                            n_p = heap_push(ps, pd, n_p, part[i], cand[i])
                    for i in range(n_p):
                        pe[i] = _exact_score(q_ids, lo_q, hi_q, pd[i], indptr_v, doc_z, tf_z, float(len_d[pd[i]]),
                                             idf_v, k1, b, avgdl)
                    theta = max(theta, kth(pe, n_p, kth_buf))
                keep = 0
                for i in range(n_c):
                    d = cand[i]
                    if acc[d] * (1.0 + mu) + rest[jj] >= theta:
                        cand[keep] = d
                        keep += 1
                n_c = keep
        # the final candidates: in reach of the k-th best, and at least the `depth` best
        if n_c < 0:  # every term added in full: the best of what they touched
            walk = added < n_docs
            n_h = _best_partial(acc, hs[:max(depth, k)], hd[:max(depth, k)], indptr_v, doc_z, terms, order, nt,
                                n_docs, walk, n_docs + added, seen)
            theta = max(theta, kth(hs, n_h, kth_buf) * (1.0 - mu))
            n_c = 0
            if walk:
                for j2 in range(nt):
                    t2 = terms[order[j2]]
                    for p in range(indptr_v[t2], indptr_v[t2 + 1]):
                        d = doc_z[p]
                        if acc[d] * (1.0 + mu) >= theta:
                            cand[n_c] = d
                            n_c += 1
                for i in range(n_h):
                    cand[n_c] = hd[i]
                    n_c += 1
                n_c = sort_unique(cand, n_c)
            else:  # in passage order already; the `depth` best are among them unless depth > k
                for d in range(n_docs):
                    if acc[d] > 0 and (acc[d] * (1.0 + mu) >= theta or depth > k):
                        cand[n_c] = d
                        n_c += 1
        else:
            for i in range(n_c):
                part[i] = acc[cand[i]]
            theta = max(theta, kth(part, n_c, kth_buf) * (1.0 - mu))
        n_f = 0
        n_h = 0
        for i in range(n_c):
            d = cand[i]
            v = acc[d]
            if v <= 0:
                continue
            if v * (1.0 + mu) >= theta:
                fin[n_f] = d
                n_f += 1
            elif depth > 0:
                n_h = heap_push(hs[:depth], hd[:depth], n_h, v, d)
        for i in range(n_h):
            fin[n_f] = hd[i]
            n_f += 1
        # exact scores, then (score desc, passage asc): passage order first, then a stable sort by score
        fin[:n_f].sort()
        _exact_scores(fin, n_f, ex, q_ids, lo_q, hi_q, indptr_v, doc_z, tf_z, len_d, idf_v, k1, b, avgdl)
        got = 0
        for i in np.argsort(-ex[:n_f], kind="mergesort"):
            if got == k or ex[i] <= 0:
                break
            out_pid[qi, got] = fin[i]
            out_score[qi, got] = ex[i]
            got += 1
        # reset for the next query: re-walk the lists added in full, or clear everything
        if added < n_docs:
            for j2 in range(n_or):
                t2 = terms[order[j2]]
                for p in range(indptr_v[t2], indptr_v[t2 + 1]):
                    acc[doc_z[p]] = 0
        else:
            acc[:] = 0
    return out_pid, out_score
