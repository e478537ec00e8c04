"""Golden numbers of the embedding-memory arithmetic (tokenpos.analysis.memory)."""

from __future__ import annotations

import json

import pytest

from tokenpos.analysis.memory import (
    MB,
    MIB,
    PRESETS,
    SEED_SCENARIOS,
    ModelConfig,
    custom_config,
    embedding_memory,
    format_share,
    format_size,
    get_preset,
    position_alternatives,
    scenario_reports,
)
from tokenpos.tables.errors import ConfigError

GPT2_TOKENS = 50257 * 768  # 38,597,376


def test_gpt2_token_table_golden() -> None:
    rep = embedding_memory(get_preset("gpt2"))
    tok = rep.tables[0]
    assert tok.params == GPT2_TOKENS == 38_597_376
    assert tok.nbytes("fp32") == 154_389_504
    assert round(tok.mib("fp32"), 1) == 147.2           # the issue's example
    assert tok.mb("fp32") == pytest.approx(154.389504)
    assert tok.nbytes("fp16/bf16") == 77_194_752
    assert tok.nbytes("int8") == GPT2_TOKENS
    assert tok.train_bytes == 16 * GPT2_TOKENS            # fp32 weights + grads + Adam m, v


def test_gpt2_tables_and_share() -> None:
    rep = embedding_memory(get_preset("gpt2"))
    assert [t.name for t in rep.tables] == ["token embedding", "position (learned)"]
    assert rep.tables[1].params == 1024 * 768
    assert rep.params == 39_383_808
    assert rep.share() == pytest.approx(39_383_808 / 124_439_808)
    assert format_share(rep.share(GPT2_TOKENS)) == "31.02%"


def test_presets_cover_the_issue() -> None:
    assert {"gpt2", "gpt3-175b", "bert-base", "llama2-7b", "llama3-8b"} <= set(PRESETS)
    assert all(p.total_params for p in PRESETS.values())
    assert PRESETS["gpt3-175b"].total_exact is False


def test_untied_and_token_types() -> None:
    llama = embedding_memory(get_preset("llama3-8b"))
    assert [t.name for t in llama.tables] == ["token embedding", "output projection"]   # RoPE: no position table
    assert llama.params == 2 * 128256 * 4096
    assert llama.share() == pytest.approx(1_050_673_152 / 8_030_261_248)
    bert = embedding_memory(get_preset("bert-base"))
    assert bert.params == 30522 * 768 + 512 * 768 + 2 * 768


def test_seed_scenarios() -> None:
    gpt3 = next(c for c in SEED_SCENARIOS if c.name == "gpt3-scale")
    tok = embedding_memory(gpt3).tables[0]
    assert tok.params == 617_558_016
    assert tok.nbytes("fp32") / MB == pytest.approx(2470.232064)   # seed 004: "~2.4GB"
    assert [r.config.name for r in scenario_reports(include_presets=False)] == [c.name for c in SEED_SCENARIOS]
    names = [r.config.name for r in scenario_reports()]                # GPT-3 scale is gpt3-175b: listed once
    assert names == [c.name for c in SEED_SCENARIOS if c.name != "gpt3-scale"] + list(PRESETS)


def test_position_alternatives() -> None:
    alt = {t.name: t for t in position_alternatives(2048, 512, 8)}
    assert alt["learned"].params == 2048 * 512
    assert alt["learned"].mib("fp32") == 4.0
    for name in ("sinusoidal", "rope", "alibi", "none"):
        assert alt[name].params == 0 and alt[name].train_bytes == 0
    assert alt["t5"].params == 32 * 8


def test_custom_config_and_validation() -> None:
    rep = embedding_memory(custom_config(50257, 768))
    assert rep.params == GPT2_TOKENS                   # no max_seq_len: only the token table
    assert rep.share() is None
    with pytest.raises(ConfigError, match="vocab_size"):
        ModelConfig("x", -5, 768)
    with pytest.raises(ConfigError, match="d_model"):
        custom_config(10, 0)
    with pytest.raises(ConfigError, match="preset"):
        get_preset("gpt5")


def test_to_dict_is_json() -> None:
    d = json.loads(json.dumps(embedding_memory(get_preset("gpt2")).to_dict()))
    tok = d["tables"][0]
    assert tok["params"] == GPT2_TOKENS
    assert tok["bytes"]["bf16"] == tok["bytes"]["fp16"] == 2 * GPT2_TOKENS
    assert tok["mib"]["fp32"] == pytest.approx(GPT2_TOKENS * 4 / MIB)
    assert d["total"]["share_of_model"] == pytest.approx(39_383_808 / 124_439_808)


def test_format_size() -> None:
    assert format_size(0) == "0"
    assert format_size(147.2373) == "147.2"
    assert format_size(2355.8) == "2,355.8"
    assert format_size(0.00146) == "0.0015"


# ---------------------------------------------------------------------------------------------- vocab parallel


def test_vocab_parallel_padding_acceptance() -> None:
    from tokenpos.analysis.memory_tp import vocab_parallel_memory

    gpt2 = get_preset("gpt2")
    v = vocab_parallel_memory(gpt2, 8, 128)
    assert (v.padded_vocab, v.padding_rows, v.shard_rows) == (51_200, 943, 6_400)      # Megatron at TP 8
    assert v.padding_params == 943 * 768
    assert vocab_parallel_memory(gpt2, 1, 64).padded_vocab == 50_304                    # vLLM-style 64
    assert v.adam_bytes_per_rank == 16 * 6_400 * 768 == v.adam_bytes_if(True)
    assert v.adam_bytes_if(False) == 2 * v.adam_bytes_if(True)
    assert v.logits_per_rank == 8 * 1024 * 6_400                                       # B x L x Vl, L = 1024
    assert v.logits_bytes("bf16") * 2 == v.logits_bytes("fp32")
    assert v.logits_one_device == 8 * 1024 * 50_257


def test_vocab_parallel_untied_doubles_the_shard_and_validates() -> None:
    from tokenpos.analysis.memory_tp import vocab_parallel_memory

    v = vocab_parallel_memory(get_preset("llama3-8b"), 8, batch=1, seq_len=10)
    assert v.padding_rows == 0 and v.shard_params == 2 * 16_032 * 4096
    assert json.loads(json.dumps(v.to_dict()))["logits_per_rank"] == 10 * 16_032
    with pytest.raises(ConfigError, match="tp"):
        vocab_parallel_memory(get_preset("gpt2"), 0)


# ---------------------------------------------------------------------------------------------- no silent assumptions


def test_learned_without_length_says_the_position_table_is_not_counted() -> None:
    rep = embedding_memory(custom_config(50257, 768, positional="learned"))
    assert rep.params == GPT2_TOKENS
    assert any("no learned position table counted" in n for n in rep.notes)
    assert rep.to_dict()["notes"] == list(rep.notes)


def test_t5_never_assumes_one_head() -> None:
    with pytest.raises(ConfigError, match="num_heads"):
        embedding_memory(custom_config(32128, 64, 512, positional="t5"))
    rep = embedding_memory(custom_config(32128, 64, 512, positional="t5", num_heads=8))
    assert rep.tables[1].params == 32 * 8


def test_assumed_head_count_of_the_alternatives_is_noted() -> None:
    rep = embedding_memory(custom_config(1000, 256, 128))
    assert any("assume 4 heads" in n for n in rep.notes)
    assert not embedding_memory(custom_config(1000, 256, 128, num_heads=2)).notes


def test_total_smaller_than_the_tables_is_refused() -> None:
    with pytest.raises(ConfigError, match="smaller than the embedding tables"):
        embedding_memory(custom_config(50257, 768, total_params=1))


def test_huge_sizes_format_in_scientific_notation() -> None:
    assert format_size(8e30 / MIB) == "7.629e+24"
    assert format_size(999_999_999_999.0) == "999,999,999,999.0"


def test_logits_memory_small_batch_and_checks() -> None:
    """Fewer tokens than a block: the block holds them all; sizes below 1 and unknown dtypes are refused."""
    from tokenpos.analysis.memory import get_preset
    from tokenpos.analysis.memory_logits import logits_memory

    cfg = get_preset("gpt2")
    r = logits_memory(cfg, batch=1, seq_len=10)
    assert r.chunk_tokens == 10 and r.fused_bytes == (10 * 50257 + 10) * 4
    assert r.materialised_bytes == 2 * 10 * 50257 * 4 and r.saved_bytes == r.materialised_bytes - r.fused_bytes
    assert logits_memory(cfg).seq_len == cfg.max_seq_len and logits_memory(cfg).batch == 8
    for bad in ({"batch": 0}, {"seq_len": -1}, {"dtype": "fp16"}):
        with pytest.raises(ConfigError):
            logits_memory(cfg, **bad)  # type: ignore[arg-type]
