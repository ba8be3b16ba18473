"""Tiny configs of transformers architectures, built in code (nothing is downloaded).

Shared by ``tests/test_transformers_architectures.py`` and ``scripts/transformers_table.py``.
Each entry: ``name -> (auto class, kind, config factory)``; ``kind`` is ``"causal"`` (a decoder
LM: generate), ``"seq2seq"`` (encoder-decoder: generate from the decoder) or ``"encoder"``.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB = 100
TOKENS = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 0}


def configs():
    """``name -> (auto class name, kind, () -> config)``: a fresh config on every call."""
    import transformers as T

    dec = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        **TOKENS,
    }
    enc = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 64,
        **TOKENS,
    }
    t5 = {
        "vocab_size": VOCAB,
        "d_model": 32,
        "d_kv": 8,
        "d_ff": 48,
        "num_layers": 2,
        "num_heads": 4,
        "relative_attention_num_buckets": 8,
        "decoder_start_token_id": 0,
        "pad_token_id": 0,
        "eos_token_id": 1,
    }
    causal, seq2seq, masked = "AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForMaskedLM"
    return {
        # decoders that dispatch through AttentionInterface
        "llama": (causal, "causal", lambda: T.LlamaConfig(**dec)),
        "mistral": (causal, "causal", lambda: T.MistralConfig(**dec, sliding_window=5)),
        "qwen2": (causal, "causal", lambda: T.Qwen2Config(**dec)),
        "qwen3": (causal, "causal", lambda: T.Qwen3Config(**dec, head_dim=8)),
        "phi3": (causal, "causal", lambda: T.Phi3Config(**dec)),
        "olmo2": (causal, "causal", lambda: T.Olmo2Config(**dec)),
        "gemma": (causal, "causal", lambda: T.GemmaConfig(**dec, head_dim=8)),
        "gemma2": (
            causal,
            "causal",
            lambda: T.Gemma2Config(**dec, head_dim=8, sliding_window=6, attn_logit_softcapping=2.0),
        ),
        "gpt2": (
            causal,
            "causal",
            lambda: T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, **TOKENS),
        ),
        "gpt_oss": (
            causal,
            "causal",
            lambda: T.GptOssConfig(
                **{**dec, "intermediate_size": 32},
                head_dim=8,
                num_local_experts=4,
                num_experts_per_tok=2,
                sliding_window=4,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            ),
        ),
        # encoders
        "bert": (masked, "encoder", lambda: T.BertConfig(**enc)),
        "modernbert": (
            masked,
            "encoder",
            lambda: T.ModernBertConfig(
                **{**enc, "num_hidden_layers": 3},
                local_attention=4,
                global_attn_every_n_layers=2,
                cls_token_id=0,
                sep_token_id=1,
            ),
        ),
        # encoder-decoders
        "t5": (seq2seq, "seq2seq", lambda: T.T5Config(**t5)),
        "mt5": (seq2seq, "seq2seq", lambda: T.MT5Config(**t5)),
        "bart": (
            seq2seq,
            "seq2seq",
            lambda: T.BartConfig(
                vocab_size=VOCAB,
                d_model=32,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=48,
                decoder_ffn_dim=48,
                max_position_embeddings=64,
                decoder_start_token_id=0,
                **TOKENS,
            ),
        ),
        # dispatch through AttentionInterface from transformers 5.24 (computed attention in their own code before)
        "codegen": (
            causal,
            "causal",
            lambda: T.CodeGenConfig(
                vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64, **TOKENS
            ),
        ),
        "gptj": (
            causal,
            "causal",
            lambda: T.GPTJConfig(
                vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64, **TOKENS
            ),
        ),
    }


def refused_configs():
    """``name -> (auto class name, () -> config)`` of architectures that compute attention in their
    own code (not through AttentionInterface): qkv must refuse them."""
    import transformers as T

    return {
        "bloom": ("AutoModelForCausalLM", lambda: T.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)),
        "xglm": (
            "AutoModelForCausalLM",
            lambda: T.XGLMConfig(vocab_size=VOCAB, d_model=32, num_layers=2, attention_heads=4, ffn_dim=48),
        ),
        "mpnet": (
            "AutoModelForMaskedLM",
            lambda: T.MPNetConfig(
                vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48
            ),
        ),
        "mpt": ("AutoModelForCausalLM", lambda: T.MptConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4)),
        "deberta-v2": (
            "AutoModelForMaskedLM",
            lambda: T.DebertaV2Config(
                vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48
            ),
        ),
        "gpt_neo": (
            "AutoModelForCausalLM",
            lambda: T.GPTNeoConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                num_layers=2,
                num_heads=4,
                attention_types=[[["global", "local"], 1]],
                max_position_embeddings=64,
            ),
        ),
        "falcon": (
            "AutoModelForCausalLM",
            lambda: T.FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4),
        ),
    }
