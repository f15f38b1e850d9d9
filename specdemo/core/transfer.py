"""Tensors made on the host for a device, copied without waiting; and the host's copy of a text.

PyTorch's copy from pageable host memory to a GPU waits until the device has run everything
queued before it; a copy from pinned memory does not, and the host goes on while the device
copies. A step makes a few small tensors on the host (the tokens a pass feeds, the rows it
keeps): each goes to the device this way, so the host never waits for a pass it just queued.
The pinned memory comes from PyTorch's caching host allocator, which keeps it until the copy
has run. Off CUDA a tensor stays where it is made.

The other way, every read of a device tensor on the host waits for all queued before it. The
proposers whose guesses read the text every pass read the host's copy of it (`HostText`, the
loop's `Context.text`): read once, then grown by the tokens each pass commits, which the host knows.
"""

import numpy as np
import torch


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` (a tensor on the CPU) on `device`: with CUDA through pinned memory, without waiting."""
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host if host.device == device else host.to(device)


def tensor_on(data, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`torch.tensor(data, dtype=dtype)` on `device`, copied without waiting (`to_device`)."""
    return to_device(torch.tensor(data, dtype=dtype), device)


class HostText:
    """The host's copy of a request's text (`sequence` [1, n], token ids): read from the device at
    its first use, then grown by each pass's committed tokens (`extend`, by the loop as it grows
    the text; nothing until something read it). A copy that holds another number of tokens than
    the text is read again. It is a numpy array, whose small operations cost the host less than
    torch's, and which no reader mistakes for a tensor on the device."""

    def __init__(self):
        self.tokens: np.ndarray | None = None  # [n], int64

    def of(self, sequence: torch.Tensor) -> np.ndarray:
        """The text [n] on the host."""
        if self.tokens is None or self.tokens.shape[0] != sequence.shape[1]:
            self.tokens = sequence[0].numpy(force=True).astype(np.int64)
        return self.tokens

    def extend(self, committed: list[int]) -> None:
        """Append the tokens a pass committed."""
        if self.tokens is not None:
            self.tokens = np.concatenate([self.tokens, np.asarray(committed, dtype=np.int64)])
