"""TFF's StackOverflow files (``tests.fakes.user_formats.write_tff_stackoverflow``: TFF's HDF5 layout and word-count
file) become next-word windows in TFF's ids, one client a user; a missing vocabulary file is refused before
anything starts; TFF's word LSTM has the baseline's shape, its two paths agree, it learns the generated text, and
both engines train one client per device (natural partition) to the same diffs."""

from __future__ import annotations

from dataclasses import replace

import h5py
import pytest
import torch

from common.choices import ConfigError
from processors.data.config import DataConfig
from processors.data.sources import DatasetError, load_dataset
from processors.data.stackoverflow import (
    BOS_ID,
    EOS_ID,
    NUM_IDS,
    OOV_ID,
    PAD_ID,
    SEQUENCE_LENGTH,
    VOCAB_SIZE,
    sentence_ids,
)
from processors.models import build_model, initial_model
from processors.models.word_lstm import WordLSTM
from processors.training import TrainingConfig, evaluate_accuracy, train_local
from tests.fakes.user_formats import SO_WORDS, write_tff_stackoverflow


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch):
    monkeypatch.setenv("EDGESIM_NO_DATA_CACHE", "1")  # each test parses its own files


def _load(path, root):
    return load_dataset(DataConfig(dataset=str(path), data_root=str(root)).spec(0))


def _sentences(path, client):
    with h5py.File(path) as f:
        return [s.decode() for s in f["examples"][client]["tokens"][()]]


def test_ids_are_tffs_pad_words_oov_bos_eos():
    vocab = {w: i + 1 for i, w in enumerate(SO_WORDS)}
    assert (PAD_ID, OOV_ID, BOS_ID, EOS_ID, NUM_IDS) == (0, VOCAB_SIZE + 1, VOCAB_SIZE + 2, VOCAB_SIZE + 3, 10004)
    assert sentence_ids("the python qqunseen", vocab).tolist() == [BOS_ID, 1, 10, OOV_ID, EOS_ID]
    long = " ".join(["a"] * 25)  # over 20 words: cut to 20, no EOS (TFF's to_ids)
    assert sentence_ids(long, vocab).tolist() == [BOS_ID] + [4] * SEQUENCE_LENGTH


def test_stackoverflow_files_become_next_word_windows_per_client(tmp_path):
    path = write_tff_stackoverflow(tmp_path / "so", clients=5)
    data = _load(path, tmp_path)
    assert data.x_train.dtype == torch.int64 and data.input_shape == (SEQUENCE_LENGTH,)
    assert data.num_classes == NUM_IDS and data.users.count == 5
    with h5py.File(path) as f:
        assert data.users.names == tuple(sorted(f["examples"].keys()))
    vocab = {w: i + 1 for i, w in enumerate(SO_WORDS)}
    for u, client in enumerate(data.users.names):  # each client's samples are its own sentences, in order
        expected_x, expected_y = [], []
        for sentence in _sentences(path, client):
            ids = [BOS_ID] + [vocab.get(w, OOV_ID) for w in sentence.split(" ")[:20]]
            ids += [EOS_ID] if len(sentence.split(" ")) < 20 else []
            for t in range(1, len(ids)):
                before = ids[max(0, t - 20) : t]
                expected_x.append([PAD_ID] * (20 - len(before)) + before)
                expected_y.append(ids[t])
        idx = data.users.train_range(u)
        assert data.x_train[idx].tolist() == expected_x and data.y_train[idx].tolist() == expected_y
    assert data.users.test_offsets[-1] == len(data.y_test) > 0  # the test file's clients, each its own
    assert int(data.y_train.min()) >= 1 and int(data.y_train.max()) <= EOS_ID  # pad is never a label
    assert (data.y_train == OOV_ID).any() and (data.y_train == EOS_ID).any()
    assert torch.equal(data.prepare(data.x_train[:3]), data.x_train[:3])  # word ids are never normalised


def test_only_the_top_10000_words_of_the_word_count_file_are_the_vocabulary(tmp_path):
    filler = [f"w{i}" for i in range(VOCAB_SIZE - 2)]  # more frequent words that the sentences never use
    path = write_tff_stackoverflow(tmp_path / "so", clients=3, vocab=filler + SO_WORDS)
    data = _load(path, tmp_path)
    kept = {SO_WORDS[0]: VOCAB_SIZE - 1, SO_WORDS[1]: VOCAB_SIZE}  # the 9999th and 10000th lines
    for u, client in enumerate(data.users.names):
        words = [w for s in _sentences(path, client) for w in s.split(" ")[:20] + ["<eos>"] * (len(s.split(" ")) < 20)]
        labels = data.y_train[data.users.train_range(u)].tolist()
        assert labels == [EOS_ID if w == "<eos>" else kept.get(w, OOV_ID) for w in words]
    assert {VOCAB_SIZE - 1, VOCAB_SIZE, OOV_ID} <= set(data.y_train.tolist())


def test_a_missing_word_count_file_is_refused_in_one_line_saying_where(tmp_path):
    path = write_tff_stackoverflow(tmp_path / "so", clients=2)
    (tmp_path / "so" / "stackoverflow.word_count").unlink()
    with pytest.raises(ConfigError, match=r"so/stackoverflow.word_count.*beside the .h5 files") as info:
        DataConfig(dataset=str(path), data_root=str(tmp_path)).validate()
    assert "\n" not in str(info.value)
    renamed = tmp_path / "so" / "posts_train.h5"  # another name: refused when the tokens are read
    (tmp_path / "so" / "stackoverflow_train.h5").rename(renamed)
    (tmp_path / "so" / "stackoverflow_test.h5").rename(tmp_path / "so" / "posts_test.h5")
    with pytest.raises(DatasetError, match=r"stackoverflow.word_count"):
        _load(renamed, tmp_path)


def test_the_word_lstm_is_tffs_shape_and_its_two_paths_agree():
    model = build_model("word_lstm")
    assert isinstance(model, WordLSTM) and model.embedding.weight.shape == (NUM_IDS, 96)
    assert (model.lstm.hidden_size, model.lstm.num_layers) == (670, 1)
    assert model.project.weight.shape == (96, 670) and model.decoder.weight.shape == (NUM_IDS, 96)
    x = torch.randint(0, NUM_IDS, (3, SEQUENCE_LENGTH))
    fused = model(x)
    params = dict(model.named_parameters())
    vmapped = torch.func.vmap(lambda xx: torch.func.functional_call(model, params, (xx,)))(x.unsqueeze(0))[0]
    assert fused.shape == (3, NUM_IDS) and torch.allclose(fused, vmapped, atol=1e-5)
    a, b = initial_model("word_lstm", 4), initial_model("word_lstm", 4)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_the_planner_counts_the_word_lstms_fused_lstm():
    from simulation.planner import training_mflops

    # LSTM: 3 x 2 x 4 x 670 x (96 + 670) x 20 steps = 246.3 MFLOP; dense layers 3 x 2 x (670 x 96 + 96 x 10004)
    assert training_mflops(build_model("word_lstm"), (SEQUENCE_LENGTH,)) == pytest.approx(252.5, abs=0.5)


@pytest.mark.slow  # real training of a 4M-parameter LSTM: seconds
def test_the_word_lstm_learns_the_generated_sentences(tmp_path):
    """On the last 4 of the 20 ids only (the model does not depend on the length; the generated sentences' next
    word follows from the last one), which keeps the training real and 5 times cheaper."""
    data = _load(write_tff_stackoverflow(tmp_path / "so", clients=8, seed=1), tmp_path)
    data = replace(data, x_train=data.x_train[:, -4:].contiguous(), x_test=data.x_test[:, -4:].contiguous())
    most = int(torch.bincount(data.y_train).argmax())
    baseline = float((data.y_test == most).float().mean())  # always the most frequent training label
    model = initial_model("word_lstm", 0)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    before = evaluate_accuracy(model, data.x_test, data.y_test, prepare=data.prepare)
    cfg = TrainingConfig(model="word_lstm", local_iters=8, local_batch_size=32, local_lr=1e-2)
    train_local(model, start, data.x_train, data.y_train, cfg, torch.Generator().manual_seed(0), prepare=data.prepare)
    after = evaluate_accuracy(model, data.x_test, data.y_test, prepare=data.prepare)
    # seen: baseline 0.17, 0.46 on the test clients after 8 steps (0.71 after 12; 0.0 before)
    assert after > baseline + 0.1 and after > before + 0.1, (before, after, baseline)


@pytest.mark.slow  # real training of a 4M-parameter LSTM, both engines: seconds
def test_both_engines_train_stackoverflow_users_to_each_devices_own_diff(tmp_path):
    """Each device one client of the files (natural partition); a group (the LSTM unrolled under vmap) and each
    device alone (torch's fused LSTM) give the same diffs, up to summation order."""
    import numpy as np

    from processors.task_processor import TrainingTaskProcessor

    path = write_tff_stackoverflow(tmp_path / "so", clients=4)
    data = DataConfig(dataset=str(path), data_root=str(tmp_path), partition="natural")
    training = TrainingConfig(model="word_lstm", local_iters=1, local_batch_size=2, compute_device="cpu")
    proc = TrainingTaskProcessor(data=data.to_dict(), training=training.to_dict(), seed=0, profile="high")
    weights = {k: v.numpy() for k, v in initial_model("word_lstm", 0).state_dict().items()}
    devices = ["site-1#0", "site-1#1"]
    grouped = proc.train_group(devices, weights, version=1)
    for device_id, diff in zip(devices, grouped, strict=True):
        alone = proc.train(device_id, weights, version=1)
        assert diff.keys() == alone.keys() == weights.keys()
        for k in alone:
            np.testing.assert_allclose(diff[k], alone[k], rtol=0, atol=1e-5, err_msg=k)
        assert max(float(np.abs(d).max()) for d in alone.values()) > 1e-4  # it trained: the check is not vacuous
    assert not np.allclose(grouped[0]["decoder.weight"], grouped[1]["decoder.weight"])
