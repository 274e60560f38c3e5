"""Confidences that need no model, from a prompt's answers clustered by equivalence
(:func:`calibrl.selection.answer_clusters`, the grader's equivalence).

For a prompt with n samples, sample i in answer cluster c(i) of n_c samples:

    answer_consistency_i = n_{c(i)} / n                          (the vote share of the sample's own answer:
                                                                  self-consistency's confidence; in [0, 1])
    semantic_entropy     = - sum_c (n_c / n) log(n_c / n)        (discrete semantic entropy of the prompt's
                                                                  answer clusters, Farquhar et al., Nature 2024;
                                                                  nats; every sample of the prompt carries it)

Its negative ranks prompts (higher = surer); it is not a probability, so it gets no ECE.

Our reading for samples with NO answer (``answered`` False: the answer could not be extracted): a missing answer
agrees with nobody. Its answer consistency is 0, it still counts in n (the prompt's other answers keep shares
over all n samples), and for the entropy each missing answer is a cluster of its own, so failing to answer makes
a prompt less certain, never more (clustering missing answers together, as answer selection does, would make a
prompt whose samples all fail to answer look certain).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from calibrl.metrics._arrays import as_1d, group_index

__all__ = ["answer_consistency", "semantic_entropy"]


def _clusters(answer_ids: Any, prompt_ids: Any, answered: Any | None):
    """Dense cluster index [N] (missing answers: singletons), dense prompt index [N], prompt sizes, cluster sizes."""
    pidx, n_prompts = group_index(prompt_ids)
    ids = as_1d(answer_ids, "answer_ids")
    if ids.shape != pidx.shape:
        raise ValueError(f"answer_ids has {ids.shape[0]} entries, prompt_ids {pidx.shape[0]}")
    ok = np.ones(ids.shape, dtype=bool) if answered is None else np.asarray(answered, dtype=bool)
    if ok.shape != pidx.shape:
        raise ValueError(f"answered has {ok.shape[0]} entries, prompt_ids {pidx.shape[0]}")
    # a cluster is (prompt, answer id); a missing answer gets a key no other sample has
    dense_id, n_ids = group_index(ids, "answer_ids")
    key = np.where(ok, pidx.astype(np.int64) * n_ids + dense_id, -1 - np.arange(ids.size, dtype=np.int64))
    cluster, _ = group_index(key, "answer_ids")
    return cluster, pidx, np.bincount(pidx, minlength=n_prompts), np.bincount(cluster), ok


def answer_consistency(answer_ids: Any, prompt_ids: Any, *, answered: Any | None = None) -> np.ndarray:
    """Per sample [N]: the share of its prompt's samples whose answer is equivalent to its own (0 for a sample
    without an answer; module docstring). ``answer_ids`` [N]: cluster ids (equal within a prompt <=> equivalent
    answers); ``answered`` [N] bool, default all True."""
    cluster, pidx, n_prompt, n_cluster, ok = _clusters(answer_ids, prompt_ids, answered)
    return np.where(ok, n_cluster[cluster] / n_prompt[pidx], 0.0)


def semantic_entropy(answer_ids: Any, prompt_ids: Any, *, answered: Any | None = None) -> np.ndarray:
    """Per sample [N]: the discrete semantic entropy (nats) of its prompt's answer clusters, missing answers each a
    cluster of one (module docstring); 0 when every sample gives one answer, log n when all differ."""
    cluster, pidx, n_prompt, n_cluster, _ = _clusters(answer_ids, prompt_ids, None if answered is None else answered)
    first = np.unique(cluster, return_index=True)[1]  # one sample per cluster: its prompt
    cluster_prompt = pidx[first]
    share = n_cluster / n_prompt[cluster_prompt]
    # summed in one canonical order per prompt (by share), not in the order the clusters appear: prompts with the
    # same cluster sizes then get bit-for-bit the same entropy, so they tie when ranked
    order = np.lexsort((share, cluster_prompt))
    entropy = np.bincount(cluster_prompt[order], weights=(-share * np.log(share))[order], minlength=n_prompt.size)
    return np.maximum(entropy, 0.0)[pidx]
