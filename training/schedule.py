"""The learning-rate schedule the trainers share: linear warm-up, then cosine decay to zero, over a
number of steps or, with a time budget (`--minutes`), over that much training time.

A time budget lets one command train as far as a lent machine's time allows (a GPU session has
minutes, not hours): the decay then follows the elapsed share of the budget, training stops when it
is spent, and the report records how many steps that was.
"""

import math
import time


class Schedule:
    def __init__(self, lr: float, warmup: int, total_steps: int, minutes: float | None = None):
        self.lr, self.warmup, self.total_steps, self.minutes = lr, warmup, max(1, total_steps), minutes
        self.trained_seconds = 0.0  # time spent in training steps only (evaluation does not count)
        self._started = None

    def progress(self, step: int) -> float:
        """How far training is, 0 to 1: the share of steps, or of the time budget."""
        if self.minutes:
            return min(1.0, self.trained_seconds / (60 * self.minutes))
        return min(1.0, step / self.total_steps)

    def rate(self, step: int) -> float:
        return self.lr * min(1.0, (step + 1) / self.warmup) * 0.5 * (1 + math.cos(math.pi * self.progress(step)))

    def done(self, step: int) -> bool:
        """With a time budget: whether it is spent (without one, the epochs end training)."""
        return bool(self.minutes) and self.progress(step) >= 1.0

    def begin_step(self, optimizer, step: int) -> bool:
        """Before training step `step`: False once the budget is spent; else set the optimizer's rate
        and start timing the step."""
        if self.done(step):
            return False
        for group in optimizer.param_groups:
            group["lr"] = self.rate(step)
        self._started = time.time()
        return True

    def end_step(self) -> None:
        self.trained_seconds += time.time() - self._started


def epochs_done(epoch: int, steps: int, steps_per_epoch: int) -> float:
    """The epoch count a report gives after `steps` steps of epoch `epoch` (0-based): whole, or the
    fraction reached when a time budget stopped it."""
    return epoch + 1 if steps == steps_per_epoch else round(epoch + steps / steps_per_epoch, 2)
