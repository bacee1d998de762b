"""TFF's StackOverflow files (``tests.fakes.user_formats.write_tff_stackoverflow``: TFF's HDF5 layout and word-count
file) become next-word windows in TFF's ids, one client a user, built per client on first use (the training file
does not fit in memory); a missing vocabulary file is refused before anything starts; TFF's word LSTM has the
baseline's shape, its two paths agree, it learns the generated text, and both engines train one client per device
(natural partition) to the same diffs."""

from __future__ import annotations

from dataclasses import replace

import h5py
import numpy as np
import pytest
import torch

from common.choices import ConfigError
from processors.data import stackoverflow, tff
from processors.data.config import DataConfig
from processors.data.partition import device_indices, device_sample_count, natural_user, range_offsets
from processors.data.sources import DatasetError
from processors.data.stackoverflow import (
    BOS_ID,
    EOS_ID,
    NUM_IDS,
    OOV_ID,
    PAD_ID,
    SEQUENCE_LENGTH,
    VOCAB_SIZE,
    client_windows,
    sentence_ids,
)
from processors.data.tff import read_clients
from processors.data.users import partition_stats
from processors.models import build_model, initial_model
from processors.models.word_lstm import WordLSTM
from processors.training import TrainingConfig, evaluate_accuracy, train_local
from tests.conftest import assert_both_engines_agree
from tests.fakes.user_formats import SO_WORDS, load_user_dataset, write_tff_stackoverflow

pytestmark = pytest.mark.usefixtures("no_data_cache")


def _load(path, root):
    return load_user_dataset(path, root, partition="natural")  # the training file is read per user


def _train(data) -> tuple[torch.Tensor, torch.Tensor]:
    """Every client's training windows, client after client (what a test of the whole file compares)."""
    parts = [data.users.lazy.arrays(u) for u in range(data.users.count)]
    return torch.from_numpy(np.concatenate([x for x, _ in parts])), torch.from_numpy(
        np.concatenate([y for _, y in parts])
    )


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
        x, y = data.users.lazy.arrays(u)
        assert x.tolist() == expected_x and y.tolist() == expected_y
    assert data.users.test_offsets[-1] == len(data.y_test) > 0  # the test file's clients, each its own
    x_train, y_train = _train(data)
    assert int(y_train.min()) >= 1 and int(y_train.max()) <= EOS_ID  # pad is never a label
    assert (y_train == OOV_ID).any() and (y_train == EOS_ID).any()
    assert torch.equal(data.prepare(x_train[:3]), x_train[:3])  # word ids are never normalised


def test_only_the_top_10000_words_of_the_word_count_file_are_the_vocabulary(tmp_path):
    filler = [f"w{i}" for i in range(VOCAB_SIZE - 2)]  # more frequent words that the sentences never use
    path = write_tff_stackoverflow(tmp_path / "so", clients=3, vocab=filler + SO_WORDS)
    data = _load(path, tmp_path)
    kept = {SO_WORDS[0]: VOCAB_SIZE - 1, SO_WORDS[1]: VOCAB_SIZE}  # the 9999th and 10000th lines
    for u, client in enumerate(data.users.names):
        words = [w for s in _sentences(path, client) for w in s.split(" ")[:20] + ["<eos>"] * (len(s.split(" ")) < 20)]
        labels = data.users.lazy.arrays(u)[1].tolist()
        assert labels == [EOS_ID if w == "<eos>" else kept.get(w, OOV_ID) for w in words]
    assert {VOCAB_SIZE - 1, VOCAB_SIZE, OOV_ID} <= set(_train(data)[1].tolist())


def test_the_training_file_is_read_per_user_on_first_use_into_the_eager_windows(tmp_path, monkeypatch):
    """Loading and partitioning read no client's tokens (names and sentence counts are HDF5 metadata); a device's
    user is read when it trains or its size is asked, alone, into exactly the windows of reading the whole file;
    a small LRU keeps the users' windows, their sizes kept for good."""
    path = write_tff_stackoverflow(tmp_path / "so", clients=6)
    data = _load(path, tmp_path)
    lazy = data.users.lazy
    assert data.x_train.shape == (0, SEQUENCE_LENGTH) and data.users.train_offsets is None
    stats = partition_stats(data.users, pool=4)
    assert stats["users"] == 6 and stats["train_sentences"] == int(lazy.sentences.sum()) and lazy.reads == 0
    offsets = range_offsets(["site-1", "site-2"], 2)
    user = natural_user("site-2#1", 0, data.users.count, offsets)
    n = device_sample_count(data.y_train.numpy(), "site-2#1", 350, 0.5, 0, NUM_IDS, "natural", data.users, offsets)
    assert lazy.reads == 1  # that user's tokens only
    _, x_eager, y_eager, clients = read_clients(path)  # the whole file at once, as before
    mine = clients == data.users.names[user]
    x, y = lazy.arrays(user)
    assert np.array_equal(x, x_eager[mine]) and np.array_equal(y, y_eager[mine]) and n == len(y) > 0
    assert lazy.reads == 1  # cached
    indices = device_indices(data.y_train.numpy(), "site-2#1", 350, 0.5, 0, NUM_IDS, "natural", data.users, offsets)
    assert np.array_equal(indices, np.arange(n))  # into the user's own windows
    monkeypatch.setattr(stackoverflow, "CACHE_USERS", 2)
    others = [u for u in range(data.users.count) if u != user]
    for u in others:
        assert np.array_equal(lazy.arrays(u)[1], y_eager[clients == data.users.names[u]])
    assert len(lazy._cache) == 2 and lazy.reads == 6  # one read each; only 2 users' windows kept
    assert lazy.size(user) == n and lazy.reads == 6  # sizes stay known
    lazy.arrays(user)
    assert lazy.reads == 7  # its windows were dropped: read again
    with pytest.raises(ConfigError, match="only --partition natural"):
        DataConfig(dataset=str(path), data_root=str(tmp_path), partition="dirichlet")


def test_the_test_selection_keeps_whole_clients_in_a_fixed_order_up_to_the_cap():
    names, counts = ("a", "b", "c", "d", "e"), np.array([3, 5, 2, 4, 6])
    assert stackoverflow.test_selection(names, counts, cap=20) == dict(zip(names, [3, 5, 2, 4, 6], strict=True))
    take = stackoverflow.test_selection(names, counts, cap=9)
    assert sum(take.values()) == 9 and list(take) == sorted(take)
    whole = [c for c, n in take.items() if n == counts[names.index(c)]]
    assert len(whole) >= len(take) - 1 and all(n > 0 for n in take.values())  # at most one client cut
    assert take == stackoverflow.test_selection(names, counts, cap=9)  # no run seed: the same sentences every run
    assert sum(stackoverflow.test_selection(names, counts, cap=1).values()) == 1


def test_at_most_test_sentences_of_the_test_file_are_read_and_evaluated(tmp_path, monkeypatch):
    """TFF's test file holds about 16 million sentences: the server evaluates on 10,000 of them (here 7 of the
    generated file's 16); only the selected clients' tokens are read, into the windows of their first sentences."""
    path = write_tff_stackoverflow(tmp_path / "so", clients=8)
    test_path = str(tmp_path / "so" / "stackoverflow_test.h5")
    monkeypatch.setattr(stackoverflow, "TEST_SENTENCES", 7)
    built = []  # the sentences each client_windows call reads
    monkeypatch.setattr(
        tff, "client_windows", lambda tokens, vocab: built.append(len(tokens)) or client_windows(tokens, vocab)
    )
    data = _load(path, tmp_path)
    assert sum(built) == 7 and len(built) < 8  # 7 sentences, of fewer clients than the file's 8
    names, counts = tff.client_sentences(test_path)
    take = stackoverflow.test_selection(names, counts, cap=7)
    vocab = {w: i + 1 for i, w in enumerate(SO_WORDS)}
    with h5py.File(test_path) as f:
        expected = [client_windows(f["examples"][c]["tokens"][:n], vocab) for c, n in take.items()]
    pairs = sorted(zip(map(tuple, data.x_test.tolist()), data.y_test.tolist(), strict=True))
    assert pairs == sorted((tuple(r), int(t)) for x, y in expected for r, t in zip(x.tolist(), y, strict=True))
    stats = partition_stats(data.users, pool=4)
    assert (stats["test_sentences"], stats["test_sentences_in_file"]) == (7, int(counts.sum())) == (7, 16)
    assert stats["test_users"] == len(take)  # each evaluated client scored on its own
    monkeypatch.setattr(stackoverflow, "TEST_SENTENCES", 16)  # the whole file fits: every sentence, as before
    path = write_tff_stackoverflow(tmp_path / "again", clients=8)  # the same files: another path, another load
    whole = _load(path, tmp_path)
    assert partition_stats(whole.users)["test_sentences"] == 16 and sum(built) == 7 + 16
    assert len(whole.y_test) == len(read_clients(str(tmp_path / "again" / "stackoverflow_test.h5"), path)[2])


def test_a_missing_word_count_file_is_refused_in_one_line_saying_where(tmp_path):
    path = write_tff_stackoverflow(tmp_path / "so", clients=2)
    (tmp_path / "so" / "stackoverflow.word_count").unlink()
    with pytest.raises(ConfigError, match=r"so/stackoverflow.word_count.*beside the .h5 files") as info:
        DataConfig(dataset=str(path), data_root=str(tmp_path), partition="natural").validate()
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
    x_train, y_train = _train(data)
    data = replace(data, x_train=x_train[:, -4:].contiguous(), y_train=y_train, x_test=data.x_test[:, -4:].contiguous())
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
    path = write_tff_stackoverflow(tmp_path / "so", clients=4)
    data = DataConfig(dataset=str(path), data_root=str(tmp_path), partition="natural")
    training = TrainingConfig(model="word_lstm", local_iters=1, local_batch_size=2, compute_device="cpu")
    assert_both_engines_agree(data, training, ["site-1#0", "site-1#1"])
