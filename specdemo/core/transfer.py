"""Tensors made on the host for a device, copied without waiting.

PyTorch's copy from pageable host memory to a GPU waits until the device has run everything
queued before it; a copy from pinned memory does not, and the host goes on while the device
copies. A step makes a few small tensors on the host (the tokens a pass feeds, the rows it
keeps): each goes to the device this way, so the host never waits for a pass it just queued.
The pinned memory comes from PyTorch's caching host allocator, which keeps it until the copy
has run. Off CUDA a tensor stays where it is made.
"""

import torch


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` (a tensor on the CPU) on `device`: with CUDA through pinned memory, without waiting."""
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host if host.device == device else host.to(device)


def tensor_on(data, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`torch.tensor(data, dtype=dtype)` on `device`, copied without waiting (`to_device`)."""
    return to_device(torch.tensor(data, dtype=dtype), device)
