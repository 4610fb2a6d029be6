"""data/tokenizer.py: the byte-level BPE (trained on the train split only), bytes per token, pieces that
encode as the whole text, streaming decode, nanoGPT's files, and the one-line refusals of bad input.

Every tokenizer here is trained for real with the `tokenizers` library, on a text written by the test."""

from __future__ import annotations

import json
import math
import os
import pickle
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import invoke, one_error_line

from anatomy_cli.data import load, prepared
from anatomy_cli.data import tokenizer as tok_mod
from anatomy_cli.data.batches import BatchSampler, bits_per_byte, eval_counts, fixed_windows
from anatomy_cli.data.corpus import DataError, build_corpus
from anatomy_cli.data.tokenizer import StreamDecoder, Tokens, train_bpe, vocab_maker

pytestmark = [pytest.mark.filterwarnings("error"), pytest.mark.usefixtures("single_thread")]

# English and Chinese, as the embedded corpus is: a character is 1 to 4 bytes, never "a byte".
LINES = ["The model reads a token and predicts the next one.", "注意力机制让模型看到距离。",
         "RoPE turns queries and keys by their position; 位置编码 rotates them.", "Grüße — naïve café 🙂",
         "  two spaces, a\ttab, and\n\n  a blank line", "数字 1234 and 56789 stay digits."]


def text_of(n_lines: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return "\n".join(rng.choice(LINES) for _ in range(n_lines))


TEXT = text_of(400)
VAL_ONLY = "zqxjzqxjzqxj"  # a string only the val split holds: a tokenizer trained on it would merge it


@pytest.fixture(scope="module")
def bpe():
    return train_bpe([TEXT], 400)


def val_text(text: str, val_frac: float = 0.1) -> str:
    """The val split of a text source, computed here independently: its last int(n * val_frac) characters."""
    return text[len(text) - int(len(text) * val_frac):]


# --------------------------------------------------------------------------------- training


def test_bpe_has_the_size_asked_the_special_first_and_every_byte(bpe):
    assert len(bpe) == 400 and bpe.tok.get_vocab_size(with_added_tokens=True) == 400
    assert bpe.tok.token_to_id("<|endoftext|>") == 0
    assert sorted(bpe.token_bytes()[1:257].tolist()) == [1] * 256  # the byte alphabet, one byte each
    assert bpe.token_bytes()[0] == 0  # the special stands for no text


def test_bpe_round_trips_every_text(bpe):
    unseen = "Ωmega ∑ 𝔘nicode the model <|endoftext|> ünd 注意"  # characters it never saw, and the special as text
    for text in (TEXT, unseen, "", " ", "\n\n\n"):
        ids = bpe.encode(text)
        assert bpe.decode(ids) == text
        assert int(bpe.token_bytes()[ids].sum()) == len(text.encode("utf-8"))
    assert 0 not in bpe.encode("<|endoftext|>")  # a corpus that holds the special's text is encoded as text


def test_bpe_training_is_deterministic():
    a, b = train_bpe([TEXT], 350), train_bpe([TEXT[:1000], TEXT[1000:]], 350)  # other pieces, same text
    assert a.sha256 == b.sha256 and a.json == b.json


def test_bpe_trains_on_the_train_split_only(tmp_path):
    text = TEXT + "\n" + " ".join([VAL_ONLY] * 100)  # the last tenth holds VAL_ONLY, the rest never does
    assert VAL_ONLY not in text[: len(text) - int(len(text) * 0.1)]
    corpus = load.corpus_from_source(write(tmp_path, text), 0.1, 8, "bpe:420")
    tokens = set(corpus.vocab.tok.get_vocab())
    assert not any("zq" in t or "xj" in t for t in tokens)  # not one merge of the val-only string
    whole = train_bpe([text], 420)  # the same size trained on the whole text merges it at once
    assert any("zq" in t for t in whole.tok.get_vocab())


def write(tmp_path, text: str, name: str = "text.txt"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_text_source_trains_the_same_tokenizer_every_time(tmp_path):
    src = write(tmp_path, TEXT)
    a, b = (load.corpus_from_source(src, 0.1, 8, "bpe:300") for _ in range(2))
    assert a.vocab.sha256 == b.vocab.sha256 and np.array_equal(a.train, b.train) and np.array_equal(a.val, b.val)


# ------------------------------------------------------------------------------------ pieces


def test_pieces_encode_to_the_ids_of_the_whole_text(bpe, monkeypatch):
    """Cut points fall where no token spans: text given in pieces cut anywhere, re-cut into pieces of 64
    characters, encodes to the ids of the whole text (GPT-2's pre-tokenizer, spaces, tabs, newlines, CJK)."""
    monkeypatch.setattr(tok_mod, "PIECE_CHARS", 64)
    rng = random.Random(1)
    cuts = sorted(rng.sample(range(1, len(TEXT)), 40))
    pieces = [TEXT[i:j] for i, j in zip([0, *cuts], [*cuts, len(TEXT)])]
    got = np.concatenate([ids for _, ids in bpe.encode_parts(((0, p) for p in pieces), np.dtype("uint16"))])
    assert got.tolist() == bpe.tok.encode(TEXT, add_special_tokens=False).ids
    batches = list(tok_mod.cut_pieces(pieces, 64))
    assert "".join(p for b in batches for p in b) == TEXT and max(len(p) for b in batches for p in b) < 200


def test_a_run_without_cut_points_is_cut_only_past_max_carry(monkeypatch):
    monkeypatch.setattr(tok_mod, "MAX_CARRY", 500)
    chinese = "注意力机制让模型看到距离" * 100  # no space, no newline: no cut point at all
    batches = list(tok_mod.cut_pieces([chinese[:300], chinese[300:600], chinese[600:]], 64))
    assert "".join(p for b in batches for p in b) == chinese
    assert [len(p) for b in batches for p in b] == [600, 600]  # held whole until past MAX_CARRY


# ------------------------------------------------------------------------------ bits per byte


def char_and_bpe(tmp_path, text: str = TEXT, n: int = 400):
    src = write(tmp_path, text)
    return load.corpus_from_source(src, 0.1, 8), load.corpus_from_source(src, 0.1, 8, f"bpe:{n}")


def test_char_and_bpe_count_the_same_bytes_of_the_same_text(tmp_path):
    char, bpe = char_and_bpe(tmp_path)
    want = len(val_text(TEXT).encode("utf-8"))
    assert want > len(val_text(TEXT)) + 100  # the text is not one byte a character
    for corpus in (char, bpe):
        assert int(corpus.vocab.token_bytes()[np.asarray(corpus.val)].sum()) == want
    assert bpe.meta["val_bytes"] == want and len(bpe.val) < len(char.val)  # fewer tokens, the same bytes


def test_a_model_uniform_over_bytes_gives_exactly_8_bits_per_byte(tmp_path):
    """Such a model pays ln 256 nats per byte of text, whatever the tokens: over the whole val split (one
    window holding it all), its summed nats over the counted bytes, in bits, is 8 for the char run and
    the BPE run alike. The bytes the model pays for come from the text, not from token_bytes."""
    for corpus in char_and_bpe(tmp_path):
        ids = np.asarray(corpus.val)
        first = corpus.vocab.decode([int(ids[0])])  # the one id that is an input only, never a target
        assert "\ufffd" not in first
        paid = math.log(256) * (len(val_text(TEXT).encode("utf-8")) - len(first.encode("utf-8")))
        tokens, n_bytes = eval_counts(corpus, len(ids) - 1, 1, 1)
        assert tokens == len(ids) - 1
        assert bits_per_byte(paid / tokens, tokens, n_bytes) == pytest.approx(8.0, abs=1e-9)


def test_a_character_split_across_tokens_is_counted_once(tmp_path):
    """A rare CJK character stays as its three byte tokens; each decodes alone to U+FFFD (3 bytes), so a
    count by decoded token would say 9; the tokens' own bytes say 3, as the character run's one id does."""
    bpe = train_bpe([TEXT.replace("距", "")], 300)
    ids = bpe.encode("距")
    assert len(ids) == 3 and all(bpe.decode([i]) == "\ufffd" for i in ids)
    assert int(bpe.token_bytes()[ids].sum()) == 3 == len("距".encode())
    char = build_corpus(TEXT, "toy")
    assert int(char.vocab.token_bytes()[char.vocab.encode("距")].sum()) == 3


def test_eval_counts_are_the_bytes_of_the_windows_targets(tmp_path):
    """eval_counts against the windows themselves (fixed_windows' targets), each token's bytes computed
    here another way: a byte-level token's string has one character per byte; a character its UTF-8."""
    for corpus in char_and_bpe(tmp_path):
        vocab = corpus.vocab
        size = ([len(c.encode()) for c in vocab.chars] if vocab.spec == "char"
                else [0 if i == 0 else len(vocab.tok.id_to_token(i)) for i in range(len(vocab))])
        windows = fixed_windows(corpus.val, 3, 16, 4)
        want = sum(size[int(t)] for _, y in windows for t in y.flatten())
        assert eval_counts(corpus, 16, 3, 4) == (3 * 4 * 16, want)


# ------------------------------------------------------------------------------- streaming


def test_streaming_decode_holds_a_token_that_ends_inside_a_character(bpe):
    """Pushed one id at a time, the text never shows U+FFFD for a character still arriving, and joined it is
    the text; some id of it ends inside a character (otherwise the test would prove nothing)."""
    text = "Grüße 注意距 🙂 done"
    ids = bpe.encode(text)
    assert any("\ufffd" in bpe.decode(ids[: k + 1]) for k in range(len(ids)))
    stream = StreamDecoder(bpe, bpe.encode("prefix "))
    out = [stream.push(i) for i in ids]
    assert all("\ufffd" not in piece for piece in out)
    assert "".join(out) + stream.flush() == text


def test_streaming_decode_of_any_ids_is_the_decoded_text(bpe):
    """Random ids (what an untrained model samples) stream to exactly decode(ids): U+FFFD only where the ids
    themselves are not UTF-8."""
    rng = random.Random(0)
    prefix = bpe.encode("start ")
    for _ in range(20):
        ids = [rng.randrange(len(bpe)) for _ in range(30)]
        stream = StreamDecoder(bpe, prefix)
        got = "".join(stream.push(i) for i in ids) + stream.flush()
        assert "start " + got == bpe.decode(prefix + ids)


# ------------------------------------------------------------------------------ nanoGPT's files


def test_a_plain_uint16_memmap_reads_the_ids_anatomy_trains_on(tmp_path):
    """nanoGPT's train.py: np.memmap(train.bin, dtype=np.uint16, mode='r') and meta.pkl's vocab_size."""
    out = tmp_path / "bpe"
    meta = prepared.prepare(load.open_source(write(tmp_path, TEXT)), out, 0.1, 16, tokenizer="bpe:400")
    assert meta["dtype"] == "H" and meta["token_dtype"] == "uint16" and meta["tokenizer"] == "bpe:400"
    assert pickle.loads((out / "meta.pkl").read_bytes())["vocab_size"] == 400
    corpus = load.load_corpus(str(out), 0.1, 16, "bpe:400")
    assert isinstance(corpus.train, np.memmap)
    for name, split, part in (("train.bin", corpus.train, TEXT[: len(TEXT) - int(len(TEXT) * 0.1)]),
                              ("val.bin", corpus.val, val_text(TEXT))):
        plain = np.memmap(out / name, dtype=np.uint16, mode="r")
        assert np.array_equal(plain, split)
        assert plain.tolist() == corpus.vocab.tok.encode(part, add_special_tokens=False).ids  # the split, whole
    x, y = BatchSampler(corpus.train, 4, 16, seed=3).next()  # a batch: rows of the plain memmap, as nanoGPT cuts
    plain = np.memmap(out / "train.bin", dtype=np.uint16, mode="r")
    starts = torch.randint(len(plain) - 16, (4,), generator=torch.Generator().manual_seed(3)).tolist()
    assert x.tolist() == [plain[i : i + 16].tolist() for i in starts]
    assert y.tolist() == [plain[i + 1 : i + 17].tolist() for i in starts]


def test_a_char_folder_is_as_it_always_was(tmp_path):
    out = tmp_path / "char"
    meta = prepared.prepare(load.open_source(write(tmp_path, TEXT)), out, 0.1, 16)
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin", "vocab.json"]
    assert not {"tokenizer", "tokenizer_sha256", "token_dtype", "train_bytes"} & set(meta)
    assert meta["dtype"] == "B" and "char_counts" in meta  # < 256 characters: uint8, as before


# ------------------------------------------------------------------------------- bad input


def prepare_cli(tmp_path, *args):
    return invoke("prepare", str(write(tmp_path, TEXT)), "--ctx-len", "16", *args)


@pytest.mark.parametrize("spec", ["bpe:0", "bpe:1", "bpe:256", "bpe:x"])
def test_a_vocabulary_below_the_bytes_and_specials_is_one_line(tmp_path, spec):
    result = prepare_cli(tmp_path, "--tokenizer", spec, "--out", str(tmp_path / "out"))
    one_error_line(result, "at least 257 tokens")
    assert not (tmp_path / "out").exists()
    result = invoke("train", "--set", f"data.tokenizer={spec}", "--steps", "1")
    one_error_line(result, "at least 257 tokens")


def test_a_vocabulary_the_corpus_cannot_fill_says_what_it_learned(tmp_path):
    result = prepare_cli(tmp_path, "--tokenizer", "bpe:60000", "--out", str(tmp_path / "out"))
    line = one_error_line(result, "more than the train split can fill")
    learned = int(line.split("pairs for ")[1].split(" tokens")[0].replace(",", ""))
    assert 257 < learned < 60000 and f"bpe:{learned} or fewer" in line
    assert not (tmp_path / "out").exists()  # nothing left behind
    assert prepare_cli(tmp_path, "--tokenizer", f"bpe:{learned}", "--out", str(tmp_path / "out")).exit_code == 0


def test_a_missing_or_corrupt_tokenizer_json_is_one_line(tmp_path):
    one_error_line(prepare_cli(tmp_path, "--tokenizer", str(tmp_path / "nope.json"), "--out", str(tmp_path / "a")),
                   "tokenizer not found")
    bad = write(tmp_path, '{"version": "1.0", "model": {"type": "BPE"', "bad.json")
    one_error_line(prepare_cli(tmp_path, "--tokenizer", str(bad), "--out", str(tmp_path / "b")),
                   "corrupt tokenizer file")
    one_error_line(invoke("train", "--set", f"data.tokenizer={bad}", "--steps", "1"), "corrupt tokenizer file")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def word_level(tmp_path):
    """A user's tokenizer.json without byte fallback: a word vocabulary of the English words alone."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted(set("".join(c if c.isascii() else " " for c in TEXT).split()))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "words.json"
    tok.save(str(path))
    return path


def test_a_tokenizer_that_cannot_encode_the_text_is_one_line(tmp_path):
    result = prepare_cli(tmp_path, "--tokenizer", str(word_level(tmp_path)), "--out", str(tmp_path / "out"))
    line = one_error_line(result, "cannot encode the text as it is")
    assert "'注'" in line or "' '" in line  # it names what does not come back
    assert not (tmp_path / "out").exists()
    with pytest.raises(DataError, match="cannot encode"):
        Tokens.load(word_level(tmp_path)).encode("the model 注意")


def test_another_tokenizer_on_a_prepared_folder_loses_nothing(tmp_path):
    out = tmp_path / "out"
    assert prepare_cli(tmp_path, "--out", str(out)).exit_code == 0  # char
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    one_error_line(prepare_cli(tmp_path, "--tokenizer", "bpe:300", "--out", str(out)), "prepared with char")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # training names the folder's tokenizer, and the setting that trains on it
    one_error_line(invoke("train", "--set", f"data.source={out}", "--set", "data.tokenizer=bpe:300", "--steps", "1"),
                   "--set data.tokenizer=char")


def test_a_bpe_folder_needs_its_tokenizer_named(tmp_path):
    out = tmp_path / "out"
    assert prepare_cli(tmp_path, "--tokenizer", "bpe:300", "--out", str(out)).exit_code == 0
    one_error_line(invoke("train", "--set", f"data.source={out}", "--steps", "1"), "--set data.tokenizer=bpe:300")
    saved = tmp_path / "same.json"
    saved.write_bytes((out / "tokenizer.json").read_bytes())  # the same tokenizer.json by its path: accepted
    prepared.check_tokenizer(out, prepared.read_meta(out), str(saved))


def test_an_edited_tokenizer_json_is_refused_by_name(tmp_path):
    out = tmp_path / "out"
    assert prepare_cli(tmp_path, "--tokenizer", "bpe:300", "--out", str(out)).exit_code == 0
    data = json.loads((out / "tokenizer.json").read_text())
    data["model"]["merges"] = data["model"]["merges"][::-1]  # the same size, other merges
    (out / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(DataError, match="tokenizer.json changed since it was prepared"):
        load.load_corpus(str(out), tokenizer="bpe:300")
    one_error_line(invoke("train", "--set", f"data.source={out}", "--set", "data.tokenizer=bpe:300", "--steps", "1"),
                   "tokenizer.json changed since it was prepared")


def test_an_hf_tokenizer_offline_is_one_line(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-m", "anatomy_cli", "prepare", str(write(tmp_path, TEXT)),
                             "--tokenizer", "hf:gpt2", "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, env=env, timeout=300)
    one_error_line(result, "cannot get the tokenizer hf:gpt2")
    assert not (tmp_path / "out").exists()


def test_a_maker_for_each_spec():
    assert vocab_maker("char") is None
    assert len(vocab_maker("bpe:300")(lambda: iter([TEXT]))) == 300
