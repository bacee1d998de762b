"""The evaluator computes on fewer threads than torch's default, and only its own thread does: a thread that starts
torch work later (the applier's FedRevive distillation) keeps the default, hence its bits."""

from __future__ import annotations

import threading

import pytest
import torch

from evaluation.evaluator import eval_threads, limit_this_thread


def _in_thread(work) -> dict:
    seen: dict = {}
    t = threading.Thread(target=lambda: seen.update(work()))
    t.start()
    t.join()
    return seen


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one intra-op thread already")
def test_the_evaluation_thread_limits_itself_and_no_thread_started_later(default_torch_threads):
    default = torch.get_num_threads()
    assert default == default_torch_threads >= 2  # not the tests' one thread (conftest.one_torch_thread)
    assert eval_threads(torch.device("cpu")) <= max(1, default)
    assert _in_thread(lambda: (limit_this_thread(1), {"evaluator": torch.get_num_threads()})[1]) == {"evaluator": 1}
    assert _in_thread(lambda: {"later": torch.get_num_threads()}) == {"later": default}
    assert torch.get_num_threads() == default
