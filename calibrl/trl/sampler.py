"""The training sampler: TRL's ``RepeatSampler`` with an epoch-exact shuffle, so a resumed run sees the prompts an
uninterrupted run sees.

TRL 1.16's ``RepeatSampler`` shuffles each epoch with one ``torch.Generator`` seeded once: the order of epoch ``e``
is the ``e + 1``-th permutation that generator draws. transformers resumes a run by building a fresh dataloader and
calling its sampler's ``set_epoch(e)``, which ``RepeatSampler`` does not have, so a run resumed in epoch ``e >= 1``
drew epoch 0's order again (different prompts from the first resumed step on). :class:`EpochExactRepeatSampler`
adds ``set_epoch``: it replays the generator from its initial state to the state after ``e`` permutations. An
uninterrupted run asks for the epoch it is in and draws exactly what ``RepeatSampler`` draws.
"""

from __future__ import annotations

import torch
from trl.trainer.utils import RepeatSampler

__all__ = ["EpochExactRepeatSampler", "epoch_exact"]


class EpochExactRepeatSampler(RepeatSampler):
    """``RepeatSampler`` (same arguments, same order) plus ``set_epoch(epoch)``: the next iteration yields the order
    of epoch ``epoch`` of an uninterrupted run (``epoch`` permutations drawn before it from the seeded generator)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._initial_state = self.generator.get_state() if self.shuffle else None
        self._epochs_drawn = 0  # permutations drawn so far = the epoch the next iteration yields

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration yield epoch ``epoch``'s order (a no-op when it is the next one anyway)."""
        if not self.shuffle or epoch == self._epochs_drawn:
            return
        self.generator.set_state(self._initial_state)
        for _ in range(epoch):
            torch.randperm(self.num_samples, generator=self.generator)
        self._epochs_drawn = epoch

    def __iter__(self):
        self._epochs_drawn += 1  # counted when the permutation is drawn: at the first item, as RepeatSampler draws it
        yield from super().__iter__()


def epoch_exact(sampler):
    """``sampler`` as an :class:`EpochExactRepeatSampler` when it is a plain TRL ``RepeatSampler`` (else as is)."""
    if type(sampler) is not RepeatSampler:
        return sampler
    return EpochExactRepeatSampler(
        data_source=sampler.data_source, mini_repeat_count=sampler.mini_repeat_count, batch_size=sampler.batch_size,
        repeat_count=sampler.repeat_count, shuffle=sampler.shuffle, seed=sampler.seed)
