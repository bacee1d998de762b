"""WordLSTM: TFF's StackOverflow next-word model (``tff.simulation.baselines.stackoverflow``'s recurrent model,
``create_recurrent_model``: embedding 96, one LSTM of 670 units, a dense layer to 96, then a dense projection to
the extended vocabulary's logits). The extended vocabulary is TFF's: pad, 10000 words, OOV, BOS, EOS = 10004 ids
(``processors.data.stackoverflow``). Its inputs are word ids (int64, N x 20), its label the id of the next word;
the projection reads the last step's output only (TFF's reads every step: the single-label form of the text task,
``docs/tasks.md``).

Like ``processors.models.char_lstm`` (whose helper it shares), one device at a time runs torch's fused LSTM and,
under ``torch.func`` (the vectorised engine), the same weights unrolled over time into matmuls that vmap batches.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from processors.data.stackoverflow import NUM_IDS
from processors.models.char_lstm import _under_transform
from processors.models.seeding import reset_parameters_seeded

EMBEDDING_DIM = 96  # TFF's baseline embedding_size
HIDDEN = 670  # TFF's baseline latent_size (one layer)


class WordLSTM(nn.Module):
    """embedding 10004 -> 96, LSTM 96 -> 670, dense 670 -> 96, dense 96 -> 10004 on the last step."""

    def __init__(self, num_classes: int = NUM_IDS, init_seed: int | None = None):
        super().__init__()
        self.embedding = nn.Embedding(num_classes, EMBEDDING_DIM)
        self.lstm = nn.LSTM(EMBEDDING_DIM, HIDDEN, batch_first=True)
        self.project = nn.Linear(HIDDEN, EMBEDDING_DIM)
        self.decoder = nn.Linear(EMBEDDING_DIM, num_classes)
        if init_seed is not None:
            reset_parameters_seeded(self, init_seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # word ids; a float probe of the right shape (the planner's, simulation.planner) reads as id 0 (pad)
        tokens = x if not x.is_floating_point() else x.long()
        h = self.embedding(tokens)  # N x L x 96
        if _under_transform(h, self.lstm.weight_hh_l0):
            last = self._unrolled(h)
        else:
            last = self.lstm(h)[0][:, -1]
        return self.decoder(self.project(last))

    def _unrolled(self, h: torch.Tensor) -> torch.Tensor:
        """``nn.LSTM``'s recurrence (gates i, f, g, o) step by step, from the same parameters: the last state."""
        lstm = self.lstm
        projected = h @ lstm.weight_ih_l0.T + (lstm.bias_ih_l0 + lstm.bias_hh_l0)  # every step's input term
        state = cell = projected.new_zeros(projected.shape[0], HIDDEN)
        for t in range(projected.shape[1]):
            i, f, g, o = (projected[:, t] + state @ lstm.weight_hh_l0.T).chunk(4, dim=1)
            cell = torch.sigmoid(f) * cell + torch.sigmoid(i) * torch.tanh(g)
            state = torch.sigmoid(o) * torch.tanh(cell)
        return state
