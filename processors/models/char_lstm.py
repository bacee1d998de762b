"""CharLSTM: LEAF's Shakespeare next-character model (``models/shakespeare/stacked_lstm.py``): an 8-dimensional
embedding of the 80 symbols, two stacked LSTM layers of 256 units, and a dense layer from the last step's output to
the 80 symbols' logits. Its inputs are token ids (int64, N x L; LEAF's windows are 80 characters), its label the id
of the character that follows.

Two paths through the same weights (``nn.LSTM``'s, so the state-dict keys are ``lstm.weight_ih_l0`` and so on):
one device at a time (``processors.training.train_local``) runs torch's fused LSTM; under ``torch.func.vmap`` (the
vectorised engine, ``processors.training_vectorized``), where the fused kernel has no batching rule and torch
falls back to a slow loop over the devices, the layers are unrolled over time into matmuls and pointwise ops, which
vmap batches across devices. The two agree up to floating-point summation order (``tests/processors``).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from processors.models.seeding import reset_parameters_seeded

VOCAB_SIZE = 80  # LEAF's ALL_LETTERS (processors.data.text)
EMBEDDING_DIM = 8
HIDDEN = 256
LAYERS = 2


def _under_transform(*tensors: torch.Tensor) -> bool:
    """Whether a torch.func transform (vmap, grad) wraps any of the tensors: the fused LSTM kernel is then avoided."""
    wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    if wrapped is None:  # an unknown torch: the unrolled path is right everywhere, only slower
        return True
    return any(wrapped(t) for t in tensors)


class CharLSTM(nn.Module):
    """embedding 80 -> 8, LSTM 8 -> 256 -> 256 (2 layers), dense 256 -> 80 on the last step."""

    def __init__(self, num_classes: int = VOCAB_SIZE, init_seed: int | None = None):
        super().__init__()
        self.embedding = nn.Embedding(num_classes, EMBEDDING_DIM)
        self.lstm = nn.LSTM(EMBEDDING_DIM, HIDDEN, num_layers=LAYERS, batch_first=True)
        self.decoder = nn.Linear(HIDDEN, num_classes)
        if init_seed is not None:
            reset_parameters_seeded(self, init_seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # token ids; a float probe of the right shape (the planner's, simulation.planner) reads as token 0
        tokens = x if not x.is_floating_point() else x.long()
        h = self.embedding(tokens)  # N x L x 8
        if _under_transform(h, self.lstm.weight_hh_l0):
            h = self._unrolled(h)
        else:
            h, _ = self.lstm(h)
        return self.decoder(h[:, -1])

    def _unrolled(self, h: torch.Tensor) -> torch.Tensor:
        """``nn.LSTM``'s recurrence (gates i, f, g, o) step by step, from the same parameters."""
        for layer in range(LAYERS):
            w_ih = getattr(self.lstm, f"weight_ih_l{layer}")
            w_hh = getattr(self.lstm, f"weight_hh_l{layer}")
            b = getattr(self.lstm, f"bias_ih_l{layer}") + getattr(self.lstm, f"bias_hh_l{layer}")
            projected = h @ w_ih.T + b  # every step's input term at once: N x L x 4H
            state = cell = projected.new_zeros(projected.shape[0], HIDDEN)
            outputs = []
            last = layer == LAYERS - 1  # the decoder reads the last step only: keep only that one
            for t in range(projected.shape[1]):
                gates = projected[:, t] + state @ w_hh.T
                i, f, g, o = gates.chunk(4, dim=1)
                cell = torch.sigmoid(f) * cell + torch.sigmoid(i) * torch.tanh(g)
                state = torch.sigmoid(o) * torch.tanh(cell)
                if not last:
                    outputs.append(state)
            h = state.unsqueeze(1) if last else torch.stack(outputs, dim=1)
        return h
