"""The seed documents' own examples and tests, written against tokenpos.numpy.

Seed 002 (NumPy lab): TokenEmbedding, PositionalEmbedding, SinusoidalPositionalEncoding and
TransformerEmbedding with its example (vocab 50000, d 768, max 1024 -> (2, 4, 768)).
Seed 004 (TinyTorch module 11): unit tests of the embedding, learned and sinusoidal encodings, the
complete EmbeddingLayer, and its integration test (variable-length sentences, a padded batch,
every positional variant, a large batch). Argument names follow tokenpos (d_model, positional, scale).
Seeds 000 / 003: the shape walk-throughs (2, 32, 512) and (32, 10, 512), sqrt(d) scaling.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import tokenpos.numpy as tpn
from tokenpos.numpy import (
    EmbeddingLayer,
    PositionalEmbedding,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    TransformerEmbedding,
)

# -- seed 002 --------------------------------------------------------------------------------------


def test_seed_002_example_usage():
    embedding = TransformerEmbedding(vocab_size=50000, d_model=768, max_seq_len=1024)
    token_ids = np.array([
        [101, 2054, 2003, 102],
        [101, 7592, 1010, 102],
    ])
    embeddings = embedding(token_ids)
    assert embeddings.shape == (2, 4, 768)
    assert embedding.token.weight.shape == (50000, 768)
    assert embedding.position.weight.shape == (1024, 768)
    assert np.all(np.isfinite(embeddings))
    # the example's row is the token row plus the position row
    np.testing.assert_allclose(embeddings[1, 2], embedding.token.weight.data[1010] + embedding.position.weight.data[2],
                               rtol=1e-6)


def test_seed_002_expected_shapes():
    tok = TokenEmbedding(100, 16, seed=0)
    assert tok.weight.shape == (100, 16)
    assert tok.forward(np.array([[1, 2, 3], [4, 5, 6]])).shape == (2, 3, 16)
    assert tok.forward(np.array([1, 2, 3])).shape == (3, 16)
    pos = PositionalEmbedding(max_seq_len=64, d_model=16, seed=0)
    assert pos.weight.shape == (64, 16)
    assert pos.forward(10).shape == (10, 16)
    np.testing.assert_array_equal(pos.forward(10), pos.weight.data[0:10])
    sin = SinusoidalPositionalEncoding(max_seq_len=64, d_model=16)
    assert sin.forward(10).shape == (10, 16)
    emb = TransformerEmbedding(100, 16, 64, dropout=0.1, seed=0)
    assert emb.forward(np.array([[1, 2, 3], [4, 5, 6]])).shape == (2, 3, 16)


def test_seed_002_sinusoidal_formula():
    pe = SinusoidalPositionalEncoding(50, 16, dtype=np.float64).forward(50)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            np.testing.assert_allclose(pe[pos, 2 * i], math.sin(pos / 10000 ** (2 * i / 16)), atol=1e-12)
            np.testing.assert_allclose(pe[pos, 2 * i + 1], math.cos(pos / 10000 ** (2 * i / 16)), atol=1e-12)


# -- seed 004: unit tests --------------------------------------------------------------------------


def test_seed_004_unit_embedding():
    embed = TokenEmbedding(vocab_size=100, d_model=64, init="xavier_uniform", seed=0)
    output = embed.forward(np.array([1, 2, 3]))
    assert output.shape == (3, 64)
    assert len(embed.parameters()) == 1
    assert embed.parameters()[0].shape == (100, 64)
    assert embed.forward(np.array([[1, 2, 3], [4, 5, 6]])).shape == (2, 3, 64)
    single, batch = embed.forward(np.array([1])), embed.forward(np.array([[1]]))
    assert np.allclose(single[0], batch[0, 0])
    assert all(p.requires_grad for p in embed.parameters())
    limit = math.sqrt(6.0 / (100 + 64))
    assert np.abs(embed.weight.data).max() <= limit
    with pytest.raises(ValueError, match=r"\[0, 100\)"):       # the seed's range-checked lookup
        embed.forward(np.array([100]))
    with pytest.raises(ValueError, match=r"-1"):
        embed.forward(np.array([-1]))


def test_seed_004_unit_positional_encoding():
    pos_enc = PositionalEmbedding(max_seq_len=512, d_model=64, seed=0)
    embeddings = np.random.default_rng(0).standard_normal((2, 10, 64))
    output = embeddings + pos_enc.forward(10)
    assert output.shape == (2, 10, 64)
    np.testing.assert_allclose(pos_enc.forward(5), pos_enc.forward(5))         # consistent
    np.testing.assert_allclose(pos_enc.forward(3), pos_enc.forward(5)[:3])     # prefix
    assert len(pos_enc.parameters()) == 1 and pos_enc.parameters()[0].shape == (512, 64)
    with pytest.raises(ValueError, match="513.*512"):                        # longer than the table
        pos_enc.forward(513)


def test_seed_004_unit_sinusoidal_embeddings():
    pe = SinusoidalPositionalEncoding(512, 64).forward(512)
    assert pe.shape == (512, 64)
    assert np.allclose(pe[0, 0::2], 0, atol=1e-6), "even indices at position 0 are sin(0) = 0"
    assert np.allclose(pe[0, 1::2], 1, atol=1e-6), "odd indices at position 0 are cos(0) = 1"
    small = SinusoidalPositionalEncoding(10, 8).forward(10)
    for i in range(9):
        assert not np.allclose(small[i], small[i + 1])
    test = SinusoidalPositionalEncoding(100, 16).forward(100)
    first = np.sum(np.abs(np.diff(test[:10, 0])))
    last = np.sum(np.abs(np.diff(test[:10, -1])))
    assert first > last, "lower dimensions change faster than higher ones"
    odd = SinusoidalPositionalEncoding(10, 7).forward(10)
    assert odd.shape == (10, 7)
    np.testing.assert_array_equal(odd[0], [0, 1, 0, 1, 0, 1, 0])


def test_seed_004_unit_complete_embedding_system():
    tokens = np.array([[1, 2, 3], [4, 5, 6]])
    learned = EmbeddingLayer(vocab_size=100, d_model=64, max_seq_len=128, positional="learned", seed=0)
    assert learned.forward(tokens).shape == (2, 3, 64)
    sin = EmbeddingLayer(vocab_size=100, d_model=64, positional="sinusoidal", seed=0)
    assert sin.forward(tokens).shape == (2, 3, 64)
    none = EmbeddingLayer(vocab_size=100, d_model=64, positional=None, seed=0)
    assert none.forward(tokens).shape == (2, 3, 64)
    assert learned.forward(np.array([1, 2, 3])).shape == (3, 64)
    scaled = EmbeddingLayer(vocab_size=100, d_model=64, positional=None, scale=True, seed=1)
    scaled.token.weight.data[...] = none.token.weight.data              # same weights, as the seed does
    np.testing.assert_allclose(scaled.forward(tokens), none.forward(tokens) * math.sqrt(64), rtol=1e-5)
    assert len(learned.parameters()) == 2
    assert len(sin.parameters()) == 1
    assert len(none.parameters()) == 1


# -- seed 004: integration test --------------------------------------------------------------------


def test_seed_004_integration_padded_batch():
    vocab_size, d_model, max_seq_len = 1000, 128, 64
    embed_layer = EmbeddingLayer(vocab_size=vocab_size, d_model=d_model, max_seq_len=max_seq_len,
                                 positional="learned", scale=True, padding_idx=0, seed=0)
    sentences = [[1, 15, 42, 7, 99], [23, 7, 15, 88], [1, 67, 15, 42, 7, 99, 34]]
    outputs = []
    for sentence in sentences:
        embedded = embed_layer.forward(np.array(sentence))
        outputs.append(embedded)
        assert embedded.shape == (len(sentence), d_model)
    max_len = max(len(s) for s in sentences)
    batch = np.array([s + [0] * (max_len - len(s)) for s in sentences])     # pad with 0
    assert batch.shape == (3, 7)
    batch_output = embed_layer.forward(batch)
    assert batch_output.shape == (3, max_len, d_model)
    for i, s in enumerate(sentences):   # padding on the right does not change the real tokens' vectors
        np.testing.assert_allclose(batch_output[i, : len(s)], outputs[i], rtol=1e-6)
    # padding positions hold only the positional row (the padding row is zero) and get no gradient
    np.testing.assert_allclose(batch_output[1, 4:], embed_layer.position.weight.data[4:7], rtol=1e-6)
    embed_layer.backward(np.ones_like(batch_output))
    assert not embed_layer.token.weight.grad[0].any()
    for pe_type in ["learned", "sinusoidal", None]:
        embed_test = EmbeddingLayer(vocab_size=100, d_model=64, positional=pe_type, seed=0)
        assert embed_test.forward(np.array([[1, 2, 3, 4, 5]])).shape == (1, 5, 64)
        assert len(embed_test.parameters()) == (2 if pe_type == "learned" else 1)


def test_seed_004_integration_large_batch():
    large_embed = EmbeddingLayer(vocab_size=10000, d_model=512, seed=0)
    test_batch = np.random.default_rng(0).integers(0, 10000, (32, 128))
    for _ in range(5):
        output = large_embed.forward(test_batch)
        assert output.shape == (32, 128, 512)
    assert output.dtype == np.float32


# -- seeds 000 and 003 -----------------------------------------------------------------------------


def test_seed_000_test_embeddings():
    embed = TransformerEmbedding(1000, 512, positional="sinusoidal", scale=True, dropout=0.1, seed=0)
    x = np.random.default_rng(0).integers(0, 1000, (2, 32))
    y = embed(x)
    assert y.shape == (2, 32, 512)
    embed.eval()
    np.testing.assert_allclose(embed(x), embed.token.weight.data[x] * math.sqrt(512)
                               + SinusoidalPositionalEncoding(512, 512).forward(32), rtol=1e-5, atol=1e-6)


def test_seed_003_shapes_and_scaling():
    embeddings = TokenEmbedding(10, 5, init="normal", std=0.02, scale=True, seed=0)
    output = embeddings(np.array([1, 3, 7]))
    assert output.shape == (3, 5)
    np.testing.assert_allclose(output, embeddings.weight.data[[1, 3, 7]] * math.sqrt(5), rtol=1e-6)
    big = TokenEmbedding(100, 512, seed=0)
    assert big(np.random.default_rng(0).integers(0, 100, (32, 10))).shape == (32, 10, 512)
    assert tpn.TokenEmbedding(100, 512, seed=0).weight.data.std() == pytest.approx(0.02, rel=0.05)
