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
    if len(rows) == logits.shape[0]:
        return logits.argmax(axis=1)
    return logits[rows].argmax(axis=1)


def _filtered_probs(row, params):
    """(probabilities float64, token ids or None for all) after temperature, top-k,
    min-p and top-p; zeros for dropped tokens."""
    x = row.astype(np.float64)
    x /= params.temperature
    ids = None
    k = params.top_k
    if 0 < k < x.shape[0]:
        # argpartition's order is deterministic for given input; sorting the kept ids
        # makes the draw independent of it.
        ids = np.sort(np.argpartition(x, -k)[-k:])
        x = x[ids]
    x -= x.max()
    p = np.exp(x)
    p /= p.sum()
    if params.min_p > 0.0:
        p[p < params.min_p * p.max()] = 0.0
    if params.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        mass = np.cumsum(p[order])
        # the smallest set of most likely tokens whose mass reaches top_p
        last = int(np.searchsorted(mass, params.top_p * mass[-1]))
        drop = order[last + 1:]
        p[drop] = 0.0
    return p, ids


def sample_row(row, params, rng):
    """One token drawn from logits ``row`` float ``[vocab]`` under ``params``
    (temperature > 0) with ``rng`` (numpy Generator): an int."""
    p, ids = _filtered_probs(row, params)
    cdf = np.cumsum(p)
    u = rng.random() * cdf[-1]
    j = int(np.searchsorted(cdf, u, side="right"))
    j = min(j, cdf.shape[0] - 1)
    while p[j] == 0.0 and j > 0:   # u landed on the edge of a dropped token (cdf flat)
        j -= 1
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
