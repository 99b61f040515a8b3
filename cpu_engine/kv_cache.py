"""Static KV cache: one [slots + 1, max_seq_len, kv_heads, head_dim] tensor pair per layer, handed out by slot.

The extra row is the liveness probe's (serving/health.py): a probe generates through the engine even when every
slot is taken, so a busy engine never fails its liveness check and a stuck one always does."""

from __future__ import annotations

import torch

from .model import ModelArgs


class KVCache:
    def __init__(self, args: ModelArgs, num_slots: int, max_seq_len: int, dtype: torch.dtype):
        shape = (num_slots + 1, max_seq_len, args.num_kv_heads, args.head_dim)
        self.layers = [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
                       for _ in range(args.num_layers)]
        self.compute_dtype = dtype
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self._free = list(range(num_slots - 1, -1, -1))
        self.probe_slot = num_slots
        self._probe_free = True

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        return self._free.pop()

    def allocate_probe(self) -> int | None:
        """The probe's row, or None while another probe holds it."""
        if not self._probe_free:
            return None
        self._probe_free = False
        return self.probe_slot

    def release(self, slot: int) -> None:
        # Stale keys need no clearing: a slot's attention never reads past its own current position.
        if slot == self.probe_slot:
            self._probe_free = True
        else:
            self._free.append(slot)

    def copy_prefix(self, src: int, dsts: list[int], length: int) -> None:
        """Give slots ``dsts`` slot ``src``'s first ``length`` positions (a prompt prefilled once for n sequences)."""
        for k, v in self.layers:
            k[dsts, :length] = k[src, :length]
            v[dsts, :length] = v[src, :length]

    def bytes_per_token(self) -> int:
        k, _ = self.layers[0]
        return 2 * len(self.layers) * k.shape[2] * k.shape[3] * k.element_size()
