"""Token choice from one step's logits: greedy for the batch at once, random row by row.

Random sampling works on one request's logits row with that request's own
``numpy.random.Generator``, so a seeded request draws the same tokens whatever else
shares its batch. Log-probabilities are of the raw logits (before temperature, top-k,
top-p or min-p), as vLLM reports them.
"""
import numpy as np

__all__ = ["greedy", "sample_row", "log_softmax", "token_logprobs"]


def greedy(logits, rows):
    """Argmax token of each of ``rows`` (int array) of ``logits`` float32 ``[B, vocab]``;
    returns int64 ``[len(rows)]``."""
    # Forked siblings share their parent's row, so a full-length ``rows`` need not be
    # 0..B-1: only then may the whole batch be reduced without a gather. The engine's list
    # is compared as a list: right after the LM head has streamed its weights every NumPy
    # call runs cold, and asarray + arange + array_equal cost ~80 us a decode step
    # (Gemma 3 270M), more than the argmax.
    if isinstance(rows, list) and rows == list(range(logits.shape[0])):
        return logits.argmax(axis=1)
    rows = np.asarray(rows, dtype=np.intp)
    if rows.shape[0] == logits.shape[0] and np.array_equal(rows, np.arange(rows.shape[0])):
        return logits.argmax(axis=1)
    return logits[rows].argmax(axis=1)


#: Tokens whose probability is below this fraction of the most likely token's are never
#: drawn (an implicit min_p; a float32 softmax over a large vocabulary rounds them away
#: anyway). Lets the sampler work on the few plausible tokens of a peaked distribution.
PROB_FLOOR = 1e-12
#: Candidate sets up to this size are sorted outright for top-p; larger ones are narrowed
#: with argpartition first.
_SORT_LIMIT = 2048


def _top_p_keep(p, top_p):
    """Positions (into ``p``) of the smallest set of most likely tokens whose mass
    reaches ``top_p`` of the total, most likely first."""
    total = p.sum()
    m = min(p.shape[0], _SORT_LIMIT)
    while True:
        part = np.argpartition(p, -m)[-m:] if m < p.shape[0] else np.arange(p.shape[0])
        if m == p.shape[0] or p[part].sum() >= top_p * total:
            break
        m = min(p.shape[0], m * 8)
    order = part[np.argsort(-p[part], kind="stable")]
    mass = np.cumsum(p[order], dtype=np.float64)   # at most a few thousand
    last = int(np.searchsorted(mass, top_p * total))
    return order[:last + 1]


def candidates(row, params):
    """(token ids int64 or None for the whole row, unnormalised probabilities float32)
    of logits ``row`` after temperature, min-p (with :data:`PROB_FLOOR`), top-k and
    top-p, in a deterministic order."""
    t = params.temperature
    thr = max(params.min_p, PROB_FLOOR)
    k = params.top_k
    V = row.shape[0]
    bound = None
    if 0 < k and 16 * k <= V:
        # The maxima of k disjoint blocks are k tokens, so the k-th largest logit is at
        # least their minimum; the same pass gives the row's maximum.
        n = V - V % k
        bm = row[:n].reshape(k, -1).max(axis=1)
        top = max(bm.max(), row[n:].max()) if n < V else bm.max()
        bound = bm.min()
    else:
        top = row.max()
    # p >= thr * p_max  <=>  logit >= top + t * log(thr); float32, so no upcast of the row
    floor = np.float32(top + t * np.log(thr))
    ids = np.flatnonzero(row >= (floor if bound is None else max(floor, bound)))
    if 2 * ids.shape[0] > V:
        ids, x, mask = None, row, True      # most survive: cheaper to zero the rest later
    else:
        x, mask = row[ids], False
    if 0 < k < x.shape[0]:
        sel = np.sort(np.argpartition(x, -k)[-k:])
        ids = sel if ids is None else ids[sel]
        x = x[sel]
    p = np.exp((x - top) * np.float32(1.0 / t))
    if mask:
        p[p < np.float32(thr)] = 0.0
    if params.top_p < 1.0 and p.shape[0] > 1:
        keep = _top_p_keep(p, params.top_p)
        ids = keep if ids is None else ids[keep]
        p = p[keep]
    return ids, p


_BLOCK = 256


def draw(p, u):
    """The index ``j`` where the running sum of ``p`` (float32 ``[n]``, not all zero)
    first exceeds ``u`` (in ``[0, 1)``) times the total: inverse-CDF sampling. Sums blocks
    of 256 first, so only one block needs a running sum (numpy's cumsum is slow)."""
    n = p.shape[0]
    nb = n // _BLOCK
    if nb < 4:
        cdf = np.cumsum(p, dtype=np.float64)
        return min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), n - 1)
    sums = np.empty(nb + 1, dtype=np.float64)
    sums[:nb] = p[:nb * _BLOCK].reshape(nb, _BLOCK).sum(axis=1)   # float32: casting reductions are slow
    sums[nb] = p[nb * _BLOCK:].sum()
    bcdf = np.cumsum(sums)
    target = u * bcdf[-1]
    b = min(int(np.searchsorted(bcdf, target, side="right")), nb)
    while b > 0 and sums[b] == 0.0:      # rounding put the target past the last mass
        b -= 1
    seg = p[b * _BLOCK:(b + 1) * _BLOCK]
    cdf = np.cumsum(seg, dtype=np.float64)
    cdf += bcdf[b - 1] if b else 0.0
    j = min(int(np.searchsorted(cdf, target, side="right")), seg.shape[0] - 1)
    # the block sums are float32 and this running sum float64: a target in the rounding gap
    # between them runs past the block's last candidate, onto a token min_p/top-k removed
    while j > 0 and seg[j] == 0.0:
        j -= 1
    return b * _BLOCK + j


def sample_row(row, params, rng):
    """One token drawn from logits ``row`` float32 ``[vocab]`` under ``params``
    (temperature > 0) with ``rng`` (numpy Generator): an int. The same row, parameters
    and generator state always give the same token. Non-finite logits (a broken
    checkpoint) still give a token: NaN counts as impossible, +inf as certain."""
    if not np.isfinite(row.max()) or not np.isfinite(row.min()):    # one pass, NaN included
        row = np.nan_to_num(row, nan=-np.inf, neginf=-np.inf, posinf=np.finfo(np.float32).max)
        if not np.isfinite(row.max()):                                 # every logit NaN or -inf
            return 0
    ids, p = candidates(row, params)
    j = draw(p, rng.random())
    return int(ids[j]) if ids is not None else j


def log_softmax(row):
    """log-softmax of ``row`` float ``[vocab]``, float64."""
    x = row.astype(np.float64)
    x -= x.max()
    x -= np.log(np.exp(x).sum())
    return x


def token_logprobs(row, token, k):
    """(logprob of ``token``, ``{token_id: logprob}`` for ``token`` and the ``k`` most
    likely tokens) under the log-softmax of raw logits ``row``."""
    lp = log_softmax(row)
    out = {}
    if k > 0:
        k = min(k, lp.shape[0])
        top = np.argpartition(lp, -k)[-k:]
        top = top[np.argsort(-lp[top], kind="stable")]
        for t in top.tolist():
            out[t] = float(lp[t])
    chosen = float(lp[token])
    out[int(token)] = chosen
    return chosen, out
