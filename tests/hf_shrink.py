"""Tiny configs of every transformers architecture, keeping every layer kind of the full config.

``tiny(model_type, head)`` builds the model type's default config again with every size named in
``SIZES`` (one table, for every config and sub-config: text, vision, audio, encoder, decoder...)
and the fewest layers that still build every layer kind the full-depth model has. A *layer kind* is
a module class (an expert layer, a mamba mixer, a linear-attention layer, a sliding or a global
attention class) or a ``layer_types`` entry; the full-depth model (at the shrunk widths, on the meta
device: no memory) says which kinds exist, and the depth grows from 2 until the tiny model has them
all: NLLB-MoE's sparse step, Jamba's attention period, Qwen3-Next's linear-attention layers beside
its full-attention ones. Per-layer patterns (``layer_types``, ``hybrid_override_pattern``, any list
or string as long as the depth) keep one of each entry, in order, before they repeat. Sizes are
passed to the config's constructor (its derived fields, head sizes and layer types, follow; a
property is never assigned).

``tests/test_transformers_sweep.py`` proves the table complete: no model above ``MAX_PARAMETERS``
because a size name was missed.
"""

import copy
import dataclasses
import inspect
import re
from typing import Any, NamedTuple

MAX_PARAMETERS = 4_000_000
MAX_DEPTH = 12
VOCAB = 128

SIZES = {
    # widths
    "hidden_size": 32, "d_model": 32, "n_embd": 32, "embed_dim": 32, "dim": 32, "word_embed_proj_dim": 32,
    "embedding_size": 32, "text_hidden_size": 32, "encoder_hidden_size": 32, "decoder_hidden_size": 32,
    "projection_dim": 32, "out_hidden_size": 32, "output_hidden_size": 32, "projector_hidden_size": 32,
    "hidden_size_global": 32, "audio_hidden_size": 32, "vision_output_dim": 32, "output_dim": 32,
    "d_inner": 48, "emb_dim": 32, "embedding_dim": 32, "enc_emb_dim": 32, "enc_dim": 32, "model_in_dim": 32,
    "encoder_hidden_dim": 32, "fusion_hidden_size": 32, "fpn_hidden_size": 32, "backbone_hidden_size": 32,
    "pooler_output_size": 32, "image_text_hidden_size": 32, "pooler_hidden_size": 32, "patch_embed_hidden_size": 32,
    "cross_hidden_size": 32, "memory_attention_hidden_size": 32, "memory_encoder_hidden_size": 32,
    "mask_downsampler_embed_dim": 32, "memory_fuser_embed_dim": 32, "attention_hidden_size": 32,
    "projection_size": 32, "downsample_hidden_size": 32, "mit_hidden_size": 32, "head_hidden_size": 32,
    "audio_embed_dim": 32, "mm_embed_dim": 32, "unit_embed_dim": 32, "vit_dim": 32, "hidden_size_per_layer_input": 8,
    "projector_input_dim": 32, "projector_output_dim": 32, "adapter_in_dim": 32, "adapter_out_dim": 32,
    "adapter_input_size": 32, "conv_output_size": 32, "image_token_embed_dim": 32, "reassemble_hidden_size": 32,
    "ple_embed_dim": 8, "feature_projection_input_dim": 32, "codevector_dim": 32, "proj_codevector_dim": 32,
    "classifier_proj_size": 32, "xvector_output_dim": 32, "text_config_hidden_size": 32,
    # feed-forward widths
    "intermediate_size": 48, "d_ff": 48, "ffn_dim": 48, "encoder_ffn_dim": 48, "decoder_ffn_dim": 48,
    "n_inner": 48, "hidden_dim": 48, "mlp_dim": 48, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16,
    "decoder_intermediate_size": 48, "dense_intermediate_size": 48, "intermediate_size_mlp": 48, "dim_feedforward": 48,
    "encoder_feedforward_dim": 48, "ffn_hidden_size": 48, "shared_intermediate_size": 16, "moe_hidden_size": 16,
    "moe_shared_expert_intermediate_size": 16, "shared_experts_intermediate_size": 16, "share_expert_dim": 16,
    "projection_intermediate_size": 48, "projection_hidden_dim": 48, "mit_intermediate_size": 48, "dff": 48,
    "dim_ff": 48, "speech_encoder_intermediate_size": 48, "t2u_encoder_ffn_dim": 48, "t2u_decoder_ffn_dim": 48,
    "encoder_linear_units": 48, "decoder_linear_units": 48, "alignment_intermediate_size": 48,
    "memory_fuser_intermediate_dim": 48, "memory_attention_feed_forward_hidden_size": 48,
    "iou_head_hidden_dim": 32, "memory_attention_mlp_hidden_size": 48, "projection_intermediate_dim": 48,
    # depths (set together by ``tiny``: see DEPTHS)
    # heads
    "num_attention_heads": 4, "num_heads": 4, "n_head": 4, "n_heads": 4, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "attention_heads": 4, "num_key_value_heads": 2, "encoder_kv_heads": 2,
    "decoder_kv_heads": 2, "num_kv_heads": 2,
    "head_dim": 8, "d_kv": 8, "kv_channels": 8, "rotary_dim": 4, "dim_head": 8, "swa_head_dim": 8,
    "attention_head_dim": 8, "cross_head_dim": 8, "resampler_head_dim": 8, "linear_head_dim": 8,
    # multi-head latent attention (DeepSeek V2/V3, Kimi, GLM-4 MoE lite, LongCat)
    "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
    "qk_head_dim": 16, "o_lora_rank": 16, "index_head_dim": 8, "index_n_heads": 2, "index_topk": 4,
    # linear attention and state-space layers
    "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "ssm_state_size": 8, "mamba_d_state": 8, "mamba_n_heads": 8, "mamba_d_head": 8, "mamba_head_dim": 8,
    "mamba_num_heads": 8, "mamba_d_ssm": 64, "mamba_chunk_size": 8, "mamba_dt_rank": 4, "chunk_size": 8,
    # experts
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_topk": 2,
    "first_k_dense_replace": 1, "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "moe_num_experts": 4,
    "moe_k": 2,
    # vocabularies and positions
    "vocab_size": VOCAB, "text_vocab_size": VOCAB, "input_vocab_size": VOCAB, "output_vocab_size": VOCAB,
    "src_vocab_size": VOCAB, "tgt_vocab_size": VOCAB, "t2u_vocab_size": VOCAB, "unit_hifi_gan_vocab_size": VOCAB,
    "vocab_size_per_layer_input": VOCAB, "audio_vocab_size": VOCAB, "vision_vocab_size": VOCAB,
    "additional_vocab_size": 8, "entity_vocab_size": 64, "entity_emb_size": 32, "codebook_size": 64,
    "max_position_embeddings": 64, "n_positions": 64, "n_ctx": 64, "max_seq_len": 64,
    "max_source_positions": 32, "max_target_positions": 64, "t2u_max_position_embeddings": 64,
    "max_2d_position_embeddings": 64, "num_position_embeddings": 64,
    # experts, embeddings and latents some families name their own way
    "expert_ffn_hidden_size": 16, "zero_expert_num": 2, "shape_embed_dim": 8, "pronunciation_embed_dim": 8,
    "shape_vocab_size": 64, "pronunciation_vocab_size": 64, "encoder_hash_byte_group_vocab": 64,
    "unpadded_vocab_size": VOCAB, "d_latents": 32, "num_latents": 16, "pred_hidden_size": 32,
    "pred_num_attention_heads": 4, "fpn_feature_size": 32, "mask_feature_size": 32, "class_embed_dim": 32,
    "decoder_dim_feedforward": 48, "decoder_hidden_dim": 32, "encoder_dim_feedforward": 48,
    "task_encoder_hidden_dim": 32, "text_projection_in_dim": 32, "text_projection_out_dim": 32,
    "nemo_conv_channels": 32, "depthwise_separable_out_channel": 32, "ext_pw_out_channel": 32,
    # audio codecs and vocoders: convolution widths
    "num_filters": 4, "upsample_groups": 32, "upsample_initial_channel": 32, "kernel_predictor_hidden_channels": 8,
    "base_channels": 32, "latent_channels": 32, "num_embeddings": 64, "patch_embeds_hidden_size": 8,
    # images, clips and spectrograms
    "crop_size": 64, "frames_per_clip": 4,
    # time series, context windows
    "sliding_window": 4, "prediction_length": 4,
    "context_length": 64, "context_size": 32, "index_kpool": 2, "indexer_budget": 8, "indexer_compress_ratio": 2,
    "num_frames": 4, "max_length": 64, "coordinate_size": 4, "shape_size": 8,
    "num_queries": 8,
    "image_size": 64, "mm_tokens_per_image": 4, "num_kv_shared_layers": 2,
    # audio codecs whose convolution stacks double the width per stride (DAC: 16x the first width)
    "dac.encoder_hidden_size": 8,
    # Swin's last stage is one window at its own image size (7 x 7 patches of 32 pixels): smaller
    # images shrink its windows below the relative-position table's
    "swin.image_size": 224,
    # Hiera's first stage is as wide as its hidden size (SAM 2's backbone: 96 of [96, ..., 768], scaled to 8)
    "sam2_hiera_det_model.hidden_size": 8, "sam2_hiera_det_model.num_attention_heads": 1,
    "sam2_hiera_det_model.blocks_per_stage": [1, 2, 3, 2],  # its windowed and global blocks by index
    # sizes a model's own code or validation ties to another: heads of 64 (BridgeTower's vision
    # MultiheadAttention), Mamba 2's heads x head size = 2 x width, NeoMME's rotary quarter of the
    # head a multiple of 4, Reformer's axial position sizes (64 + 192) summing to its width, Depth
    # Pro's patch the image model's image, EfficientLoFTR's width its last stage's, BiT's groups
    # dividing its narrowest stage, MUSE Spark's audio stages (one "layer" per stage: 4)
    "bridgetower_vision_model.hidden_size": 64, "mamba2.num_heads": 8, "neomme.head_dim": 16,
    "reformer.hidden_size": 256, "depth_pro.patch_size": 64, "efficientloftr.hidden_size": 64,
    "efficientloftr.num_attention_heads": 8,  # its 2-D rotary table is a quarter of the width: 8 heads (4 x head/2)
    "bit.num_groups": 4, "muse_spark_audio.num_hidden_layers": 4,
    "cvt.depth": [1, 2, 3],  # CvT reads stage i's drop-path rate at index i of that stage's blocks
    # widths that double per stage from a first width (codecs, VQ-GANs, convolutional stems): a
    # narrow first stage, so the last stays small
    "neucodec.encoder_hidden_size": 4, "xcodec2.encoder_hidden_size": 4,
    # NeuCodec's and X-Codec 2's quantizer reads its semantic and acoustic states side by side (2 x 32)
    "neucodec.quantization_dim": 64, "xcodec2.quantization_dim": 64,
    # their rotary tables run over the heads axis (position ids of shape (1, heads)): every head its
    # own keys, as their defaults have (16 and 16)
    "neucodec.num_key_value_heads": 4, "xcodec2.num_key_value_heads": 4, "janus_vqgan.base_channels": 32,
    "janus_vqgan.channel_multiplier": [1, 1, 1, 1, 1],
    "vibevoice_acoustic_tokenizer.num_filters": 1, "vibevoice_acoustic_tokenizer_encoder.num_filters": 1,
    "sam_vision_model.output_channels": 32, "mobilevitv2.width_multiplier": 0.5,
    "pp_lcnet_v3.scale": 0.25,
    # convolutional stacks whose code hard-wires a width beside the config's lists: EfficientNet's stem
    # (32) and top (1280) scaled by its width coefficient (the lists kept, the coefficient shrunk),
    # TextNet's stem as wide as its first stage
    "efficientnet.width_coefficient": 0.25, "efficientnet.depth_coefficient": 1.0, "efficientnet.hidden_dim": 320,
    "efficientnet.in_channels": [32, 16, 24, 40, 80, 112, 192],
    "efficientnet.out_channels": [16, 24, 40, 80, 112, 192, 320],
    "textnet.stem_out_channels": 8,
    # PP-LCNet v4's stages are a nested table of (kernel, in, out, stride, se) blocks, which no width
    # rule reaches: its stem kept as wide as their first block (PP-OCRv6 small's backbone)
    "pp_lcnet_v4.stem_channels": [3, 48, 96],
    # PP-DocLayout v3's mask branch reads its backbone's first stage (HGNet-V2 L: 128 of 2048 channels,
    # scaled to 8) by a width of its own
    "pp_doclayout_v3.x4_feat_dim": 8,
    # UVDoc's nested block tables ([in, out, dilation, downsample] blocks, [width, dilation] bridges):
    # every width a quarter of its default, the image's 3 channels and the 2-D points' 2 kept
    "uvdoc_backbone.resnet_head": [[3, 8], [8, 8]],
    "uvdoc_backbone.resnet_configs": [
        [[8, 8, 1, False], [8, 8, 3, False], [8, 8, 3, False]],
        [[8, 16, 1, True], [16, 16, 3, False], [16, 16, 3, False], [16, 16, 3, False]],
        [[16, 32, 1, True], *[[32, 32, 3, False]] * 5],
    ],
    "uvdoc_backbone.stage_configs": [
        [[32, 1]], [[32, 2]], [[32, 5]], [[32, 8], [32, 3], [32, 2]], [[32, 12], [32, 7], [32, 4]],
        [[32, 18], [32, 12], [32, 6]],
    ],
    "uvdoc.bridge_connector": [32, 32], "uvdoc.out_point_positions2D": [[32, 8], [8, 2]],
    # LW-DETR's default has no feature level (`projector_scale_factors=()`: its encoder joins none and
    # fails at full size too), where a checkpoint names its levels: one at the backbone's own scale
    "lw_detr.projector_scale_factors": [1.0],
    # ERNIE 4.5 VL's rotary sections: height and width stacked pairwise, so as many of each (the full
    # head's [22, 22, 20] at a head of 16: [3, 3, 2]; at 8 they part, [2, 1, 1])
    "ernie4_5_vl_moe_text.num_attention_heads": 2,
    # UnivNet's kernel predictor's residual blocks are as wide as its noise (`model_in_channels`), not
    # as its own hidden width (64 each by default): the two kept equal
    "univnet.model_in_channels": 8,
    # SAM 3's images whole patches of 14 (1008 = 72 x 14: 56 = 4 x 14); Kosmos-2's image in 4 tokens
    "num_key_value_heads_per_layer": 2, "sapiens2.num_key_value_attention_heads": 2,
    "sapiens2.num_first_full_attention_layers": 1, "sapiens2.num_last_full_attention_layers": 1,
    # encoders whose value projection has every head (keys grouped, values not): no grouped heads
    "nemotron3_diarization_audio.num_key_value_heads": 4, "nemotron3_5_transcribe_asr_audio.num_key_value_heads": 4,
    "nemotron3_5_transcribe_word_timestamp.num_key_value_heads": 4, "granite_speech5_encoder.num_key_value_heads": 4,
    # EdgeTAM video's 2-D latents: one per window of the shrunk image's 4 x 4 feature map
    "edgetam_video.perceiver_resampler_num_latents_2d": 16, "edgetam_video.perceiver_resampler_num_latents": 16,
    "sam3_vision_model.image_size": 56, "sam3_vit_model.image_size": 56, "kosmos-2.latent_query_num": 4,
    # SAM 3's video tracker's memory attention's rotary grid: its image's (56 = 4 x 14, hf_shrink.KWARGS)
    "sam3_tracker_video.memory_attention_rope_feat_sizes": [4, 4],
    # sizes a default config leaves for the checkpoint (ESM's padding id, Step 3.5's window) or ties
    # to another (Zamba's attention twice its width)
    "esm.pad_token_id": 1, "step3p5.sliding_window": 4, "zamba.attention_hidden_size": 64,
    "zamba.attention_head_dim": 16,
    # Apertus 1.5's image and audio codes as ranges of its vocabulary: [16, 48) and [48, 112) of 128
    "apertus1p5.image_token_offset": 16, "apertus1p5.audio_token_offset": 48,
    "apertus1p5_vision_tokenizer.codebook_size": 32,
}  # fmt: skip
"""Every size the sweep shrinks, by config attribute name, wherever a config or sub-config has it
as an integer (or None where a size is optional and ``OPTIONAL`` names it)."""

KWARGS = {
    "dots3_note_text": {
        "swa_num_attention_heads": 4, "swa_num_key_value_heads": 4, "swa_q_lora_rank": 16, "swa_kv_lora_rank": 16,
        "swa_head_dim": 16, "swa_qk_nope_head_dim": 8, "swa_v_head_dim": 8,
    },
    "uvdoc_backbone": {"out_indices": [1, 2, 3, 4, 5, 6]},
    "sam3_tracker_video": {"image_size": 56},
}  # fmt: skip
"""Sizes and choices a config's constructor takes as keyword arguments only (no field of that name),
by model type: Dots 3 Note's sliding-window layers, whose per-layer table (``per_layer_config``) the
constructor fills from ``swa_*`` arguments (every head with its keys, as its validation asks; the
head its nope and rope parts, 8 each, as the indexed layers' latent attention); UVDoc's backbone
giving the feature map of every stage, as a checkpoint's does (its default gives the last only,
where its head joins all six: the default config fails at full size); SAM 3's video tracker at its
detector's image size (its constructor takes it and sets its towers' sizes: SAM 3 video reads the
detector's features in the tracker's grid)."""

WIDTH_LISTS = frozenset(
    {
        "hidden_sizes", "embed_dims", "embed_dim", "dims", "hidden_dims", "neck_hidden_sizes", "encoder_hidden_sizes",
        "stage_out_channels", "stage_mid_channels", "stage_in_channels", "conv_dim", "tdnn_dim",
        "backbone_channel_list", "decoder_in_channels", "encoder_in_channels", "embed_dim_per_stage",
        "downsample_channels", "intermediate_size", "moe_intermediate_size", "enc_channels",
        "layer_list_out_channels", "stem_channels", "fine_fusion_dims", "intermediate_feature_dims",
        "scaled_images_feature_dims", "post_process_channels", "sscp_conv_channel_size",
        "subsampling_conv_channels", "in_channels", "out_channels", "hidden_size", "out_features",
    }
)  # fmt: skip
"""Per-stage widths (hierarchical vision and audio stacks), scaled so the widest is 64."""
DEPTH_LISTS = frozenset(
    {"depths", "depth", "num_layers_per_stage", "stage_depths", "num_layers", "blocks_per_stage", "n_attn_blocks"}
)
"""Per-stage depths, each cut to 2 (a windowed and a shifted-window block, say)."""
HEAD_LISTS = frozenset({"num_heads", "num_attention_heads", "heads", "attention_heads"})
"""Per-stage head counts, each the largest power of two up to half its value (at least 1)."""


def _size(config: Any, name: str) -> int | None:
    """The size ``SIZES`` gives ``name`` in ``config``: its own entry for the config's model type
    (``"dac.encoder_hidden_size"``) first, else the name's."""
    return SIZES.get(f"{getattr(config, 'model_type', '')}.{name}", SIZES.get(name))


def _image_side(config: Any) -> int:
    """The image side ``config`` (or its backbone's config) is built for (0: none)."""
    for c in (config, getattr(config, "backbone_config", None)):
        side = getattr(c, "image_size", None)
        side = side[0] if isinstance(side, (list, tuple)) and side else side
        if isinstance(side, int) and side > 0:
            return side
    return 0


def _list(name: str, value: list[int], widest: int = 0) -> list[int] | None:
    """A per-stage list of sizes shrunk (None: not a size list this table knows). Widths are scaled
    by one factor for the whole config (``widest``: its widest per-stage width), so a stage's output
    width still equals the next one's input (HGNet-V2's stem and stages); an image's channel count
    (up to 4) is kept."""
    if name == "image_size":
        return [SIZES["image_size"]] * len(value)
    if name in DEPTH_LISTS:
        return [min(v, 2) for v in value]
    if name in HEAD_LISTS:
        return [max(1, 2 ** max(v // 2, 1).bit_length() // 2) for v in value]
    widest = max(widest, *value)
    if name in WIDTH_LISTS and widest > 64:
        return [v if v <= 4 else max(8, round(v * 64 / widest / 8) * 8) for v in value]
    return None


def _widest(config: Any, names: set[str]) -> int:
    """The widest per-stage width of ``config``'s own width lists."""
    widths = [0]
    for name in names & WIDTH_LISTS:
        value = getattr(config, name, None)
        if isinstance(value, (list, tuple)) and value and all(type(v) is int for v in value):
            widths.append(max(value))
    return max(widths)


DEPTHS = frozenset(
    {
        "num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
        "num_decoder_layers", "num_encoder_layers", "depth", "encoder_num_hidden_layers",
        "speech_encoder_layers", "t2u_encoder_layers", "t2u_decoder_layers", "num_self_attends_per_block",
        "pred_num_hidden_layers",
    }
)  # fmt: skip
"""The depth fields, all set to the depth ``tiny`` searches for."""

TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1}

LAYER_INDICES = frozenset({"vision_feature_layer", "feature_layer", "vision_feature_layers", "intermediate_hook_ids"})
"""Layers (an index or a list: LLaVA's -2, Molmo 2's [24, 18], Depth Pro's [11, 5]) whose hidden states a model reads:
kept where the shrunk depth has them, else moved to its nearest layer."""


def _layer_index(value: Any, depth: int) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(_layer_index(v, depth) for v in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return min(value, depth - 1) if value >= 0 else max(value, -depth)
    return value


OPTIONAL = frozenset(
    {
        "num_experts_per_tok",
        "head_dim",
        "vocab_size",
        "num_key_value_heads",
        "indexer_budget",
        "indexer_compress_ratio",
        "prediction_length",
    }
)
"""Sizes a default config leaves None that its model still reads as a number (DeepSeek-V2's
``topk(k=None)``, Hunyuan's ``head_dim ** -0.5``, ESM's vocabulary, Nemotron's kv heads)."""
CHOICES = {"use_timm_backbone": False, "use_pretrained_backbone": False}
"""Choices a default config makes that need what this machine lacks: a timm backbone (timm is not
installed) or pretrained weights (nothing downloads); transformers' own backbone instead."""

PLACES = {"attn_layer_indices": [1]}
"""Per-layer choices a default config leaves None that a checkpoint sets: Bamba's attention layers
(none by default: a model of mamba layers only, which transformers' own cache cannot serve)."""
NO_ATTENTION = frozenset({"linear_attention", "mamba"})
"""Layer types of a default config made of state-space layers only (GraniteMoeHybrid's), which no
checkpoint is and transformers' own cache cannot serve: the shrunk config's last layer attends."""

KIND_PATTERNS = {
    "experts": re.compile(r"Expert|MoE|Moe|Sparse|Router|Switch"),
    "mamba": re.compile(r"Mamba|SSM|Ssm"),
    "linear attention": re.compile(r"DeltaNet|LinearAttention|Lightning|Retention|ShortConv"),
}
"""Module class names that make a layer kind worth naming in the table."""


PLACEHOLDERS = {"image": VOCAB - 1, "video": VOCAB - 2, "audio": VOCAB - 3}
"""The ids of the placeholder tokens (an image's, a video's, an audio clip's features in the text):
the top of the shrunk vocabulary, which ``hf_inputs`` never draws text from."""


PLACEHOLDER_NAMES = frozenset(f"{kind}_token_{what}" for kind in PLACEHOLDERS for what in ("id", "index"))


def special(name: str) -> int:
    """The shrunk id of a special token (``image_token_id`` -> ``VOCAB - 1``; any other out-of-range
    special token a fixed id among the top 16 below the placeholders)."""
    kind = name.split("_", 1)[0]
    if kind in PLACEHOLDERS and name in (f"{kind}_token_id", f"{kind}_token_index"):
        return PLACEHOLDERS[kind]
    return VOCAB - 4 - sum(name.encode()) % 12


class Tiny(NamedTuple):
    config: Any
    depth: int
    kinds: frozenset[str]  # every module class and layer type of the full-depth model, all built here
    parameters: int


def _fields(cls: type) -> set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}


def _pattern(value: Any, depth: int) -> Any:
    """A per-layer pattern cut to ``depth``: one of each entry first (in order), then repeating."""
    seen = list(dict.fromkeys(value))
    cut = [seen[i % len(seen)] for i in range(depth)] if seen else []
    return "".join(cut) if isinstance(value, str) else cut


def _overrides(config: Any, depth: int, full_depth: int | None) -> dict[str, Any]:
    """The constructor arguments that shrink ``config`` (and its sub-configs) to ``depth`` layers."""
    from transformers import PretrainedConfig

    names = _fields(type(config))
    widest = _widest(config, names)
    kw: dict[str, Any] = {}
    scalars: dict[Any, set[int]] = {}  # a full size -> the sizes it was shrunk to
    for name in names:
        try:
            value = getattr(config, name, None)
        except Exception:  # noqa: BLE001 - a per-layer attribute read globally (Gemma 4): set for every layer
            if _size(config, name) is not None:
                kw[name] = _size(config, name)
            continue
        if f"{config.model_type}.{name}" in SIZES:  # the model type's own entry: before every rule
            kw[name] = SIZES[f"{config.model_type}.{name}"]
            continue
        stages = name in DEPTH_LISTS | HEAD_LISTS  # per stage, not per layer (Swin's depths and heads)
        if full_depth and full_depth > 1 and not stages and _per_layer(name, value, full_depth):
            cut = _pattern(value, depth)  # one entry per layer: sizes among them shrunk like the rest
            if name == "layer_types" and depth > 1 and set(cut) <= NO_ATTENTION:
                cut[-1] = "full_attention"  # as a checkpoint has: transformers' cache needs one attention layer
            size = _size(config, name)
            kw[name] = [size] * depth if size is not None and all(isinstance(v, int) for v in cut) else cut
        elif isinstance(value, PretrainedConfig) and value.model_type.startswith("timm"):
            kw[name], kw["use_timm_backbone"] = None, False  # timm is not installed: transformers' own backbone
        elif isinstance(value, PretrainedConfig):
            kw[name] = shrunk(value, depth, own=True)
        elif name in DEPTHS and isinstance(value, int) and not isinstance(value, bool):
            kw[name] = depth
        elif _size(config, name) is not None and (
            (isinstance(value, int) and not isinstance(value, bool) and value > 0)
            or (value is None and name in OPTIONAL)
        ):
            kw[name] = _size(config, name)
            scalars.setdefault(value, set()).add(kw[name])
        elif (
            isinstance(value, (list, tuple))
            and value
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
            and _list(name, value, widest) is not None
        ):
            kw[name] = type(value)(_list(name, list(value), widest))
        elif name == "attention_types" and isinstance(value, list) and value and isinstance(value[0], list):
            kinds = value[0][0]  # GPT-Neo's [[kinds, repeats]]: the kinds repeated to the depth
            kw[name] = [[kinds, max(1, depth // len(kinds))]]
        elif name == "backbone_feature_sizes" and value and _image_side(config):  # SAM 2's feature maps
            full, side = _image_side(config), _size(config, "image_size") or SIZES["image_size"]
            kw[name] = [[max(1, v * side // full) for v in sides] for sides in value]
        elif name in LAYER_INDICES and value is not None:  # layers a model reads features from: in range
            kw[name] = _layer_index(value, depth)
        elif name in CHOICES and value != CHOICES[name]:
            kw[name] = CHOICES[name]
        elif name in PLACES and value is None:
            kw[name] = PLACES[name]
        elif name in TOKENS and isinstance(value, int):
            kw[name] = TOKENS[name]
        elif name.endswith(("_token_id", "_token_index")) and isinstance(value, int) and value >= VOCAB - 16:
            kw[name] = special(name)
        elif value is None and name in PLACEHOLDER_NAMES:  # left for the checkpoint to set (Voxtral's audio)
            kw[name] = special(name)
    kw.update(KWARGS.get(getattr(config, "model_type", ""), {}))
    for name in names & WIDTH_LISTS:  # a list of one width the config also names as a size: that size's
        value = getattr(config, name, None)  # (RT-DETR's decoder_in_channels: its encoder_hidden_dim, 256 each)
        if (
            name in kw
            and isinstance(value, (list, tuple))
            and len(set(value)) == 1
            and len(scalars.get(value[0], ())) == 1
        ):
            kw[name] = type(value)([next(iter(scalars[value[0]]))] * len(value))
    if "kv_lora_rank" in kw and "num_key_value_heads" in kw:  # latent attention: every head has its keys
        kw["num_key_value_heads"] = kw.get("num_attention_heads", SIZES["num_attention_heads"])
    for name in ("rope_parameters", "rope_scaling"):
        if isinstance(kw.get(name, getattr(config, name, None)), dict):
            rope = _rope(dict(getattr(config, name)), kw, config)
            if rope is not None:
                kw[name] = rope
    return kw


def _reads_sections(config: Any) -> dict[str, list[int]]:
    """The RoPE section keys ``config``'s model reads with a default for the full head, with that
    default (Qwen2-VL's ``mrope_section`` as ``[16, 24, 24]``, ERNIE 4.5 VL's ``[22, 22, 20]``; Qwen2-VL's
    proportions where its code gives none): named by the config class or found in its modeling code."""
    import importlib

    keys = {k: [2, 3, 3] for k in getattr(type(config), "ignore_keys_at_rope_validation", None) or () if "section" in k}
    try:
        modeling = type(config).__module__.replace(".configuration_", ".modeling_")
        source = inspect.getsource(importlib.import_module(modeling))
    except Exception:  # noqa: BLE001 - no modeling module of that name: the class's own list stands
        return keys
    for key, default in re.findall(r"""\.get\(["'](\w*section)["'](?:,\s*\[([\d,\s]+)\])?""", source):
        sizes = [int(v) for v in default.split(",") if v.strip()]
        keys[key] = sizes or keys.get(key, [2, 3, 3])
    return keys


def _rope(rope: dict[str, Any], kw: dict[str, Any], config: Any) -> dict[str, Any] | None:
    """RoPE sections (Qwen2-VL's ``mrope_section``: rotary frequencies per axis) rescaled to sum to
    the shrunk head's rotary half, in the full config's proportions; per layer type where the
    parameters are (Cohere Compass, NeoMME). None: nothing to change."""
    if rope and all(isinstance(v, dict) for v in rope.values()):
        parts = {k: _rope(dict(v), kw, config) for k, v in rope.items()}
        return {k: parts[k] or v for k, v in rope.items()} if any(parts.values()) else None
    if "rope_type" not in rope:
        return None
    width, heads = kw.get("hidden_size"), kw.get("num_attention_heads")
    head = kw.get("head_dim") or (width // heads if width and heads else SIZES["head_dim"])
    factor = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0
    half = max(int(head * factor) // 2, 1)
    changed = False
    for key, default in _reads_sections(config).items():
        if key not in rope:  # the model's code has a default for the full head: [16, 24, 24]
            rope[key], changed = list(default), True
    for key, value in rope.items():
        if "section" in key and isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            total = sum(value)
            if total != half and total > 0:
                cut = [v * half // total for v in value]
                for i in sorted(range(len(value)), key=lambda i: -value[i])[: half - sum(cut)]:
                    cut[i] += 1
                rope[key], changed = cut, True
    return rope if changed else None


def _per_layer(name: str, value: Any, depth: int) -> bool:
    """Whether ``value`` is a per-layer pattern of a ``depth``-layer config: a list of layer names
    or flags, or a string of one letter per layer (Nemotron-H's ``hybrid_override_pattern``)."""
    if isinstance(value, str):
        return "pattern" in name and len(value) == depth
    return isinstance(value, list) and len(value) == depth and all(isinstance(v, (str, bool, int)) for v in value)


def _own_depth(config: Any) -> int | None:
    for name in ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "decoder_layers", "encoder_layers"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _depth(config: Any) -> int | None:
    """The config's depth; a composite config's (a speech or vision model around a text model) is
    its deepest sub-config's, so the layer kinds of every part are searched for."""
    from transformers import PretrainedConfig

    own = _own_depth(config)
    subs = [_own_depth(v) for v in vars(config).values() if isinstance(v, PretrainedConfig)]
    return own or max((d for d in subs if d), default=None)


RULES = (
    re.compile(r"`(?P<name>[\w.]+)` \(\d+\) must equal .*?\((?P<value>\d+)\)"),  # `a` (2) must equal `b` (4)
    re.compile(r"^(?P<name>\w+) must be (?P<value>\d+), got"),  # hidden_size_per_layer_input must be 0, got 8
    re.compile(r"`(?P<name>\w+)=(?P<value>\d+)` only"),  # supports `num_experts_per_tok=1` only
)
"""A config's own validation naming the value a shrunk size must take (ESMC's heads without
grouped-query attention, WavTokenizer's codebook as wide as the model, ZAYA's single expert per
token): the size is set so, as a checkpoint of that shape would have it."""


def _repair(kw: dict[str, Any], error: Exception) -> bool:
    """Set the size ``error`` (a config validation error) names to the value it asks for; False if
    it names none this module can set."""
    text = " ".join(str(error).split())
    for rule in RULES:
        found = rule.search(text.split("ValueError: ", 1)[-1])
        if found is None:
            continue
        *path, name = found["name"].removeprefix("config.").split(".")
        target: Any = kw
        for part in path:
            target = target.get(part) if isinstance(target, dict) else getattr(target, part, None)
        value = int(found["value"])
        if isinstance(target, dict) and target.get(name) != value:
            target[name] = value
            return True
        if target is not None and not isinstance(target, dict) and getattr(target, name, None) != value:
            setattr(target, name, value)
            return True
    return False


def _built(config: Any, kw: dict[str, Any]) -> Any:
    for _ in range(4):
        try:
            return type(config)(**kw)
        except Exception as e:
            if not _repair(kw, e):
                raise
    return type(config)(**kw)


def _chosen(config: Any) -> dict[str, Any]:
    """The fields of a sub-config whose values its parent chose (not its class's defaults): RT-DETR's
    ResNet gives three feature maps (``out_indices``), where a ResNet's default gives one."""
    from transformers import PretrainedConfig

    try:
        default = type(config)()
    except Exception:  # noqa: BLE001 - no default instance to compare with: the values as they are
        return {}
    chosen = {}
    for name in _fields(type(config)) - {"transformers_version", "architectures", "id2label", "label2id"}:
        try:
            value = getattr(config, name)
            if value != getattr(default, name) and not isinstance(value, PretrainedConfig):
                chosen[name.removeprefix("_")] = value  # a backbone's `_out_indices`: passed as `out_indices`
        except Exception:  # noqa: BLE001 - a per-layer attribute read globally (Gemma 4): left to the class
            continue
    return chosen


def shrunk(config: Any, depth: int, own: bool = False) -> Any:
    """``config``'s class built again with every size of ``SIZES`` and ``depth`` layers (sizes its
    own validation asks for set as it asks: ``RULES``); ``own``: a sub-config, whose other values
    its parent chose are kept (``_chosen``). A sub-config the constructor makes itself (the
    ResNet-50 DETR builds in place of a timm backbone) is shrunk too."""
    from transformers import PretrainedConfig

    kw = _overrides(config, depth, _own_depth(config))
    built = None
    if own:  # the parent's choices, kept where they fit the shrunk stack
        with_chosen = {**_chosen(config), **kw}
        try:
            built, kw = _built(config, with_chosen), with_chosen
        except Exception:  # noqa: BLE001 - they do not (LW-DETR's ViT names 12 layers): the class's own values
            pass
    built = built if built is not None else _built(config, kw)
    made = [n for n, v in kw.items() if v is None and isinstance(getattr(built, n, None), PretrainedConfig)]
    if not made:
        return built
    return _built(config, {**kw, **{n: shrunk(getattr(built, n), depth) for n in made}})


def _kinds(model: Any, config: Any) -> set[str]:
    from transformers import PretrainedConfig

    kinds = {type(m).__name__ for m in model.modules()}

    def types(c: Any, level: int = 0) -> None:
        for value in getattr(c, "layer_types", None) or ():
            kinds.add(f"layer_types:{value}")
        if level < 3:
            for sub in vars(c).values():
                if isinstance(sub, PretrainedConfig):
                    types(sub, level + 1)

    types(config)
    return kinds


def meta_model(head: Any, config: Any) -> Any:
    import torch

    with torch.device("meta"):
        return head.from_config(copy.deepcopy(config))


def _for_head(config: Any, head: Any) -> Any:
    """The config ``head``'s class is built from: ``config``, or its sub-config of the class that
    class takes (MusicGen's causal LM is its decoder: ``MusicgenDecoderConfig`` inside ``MusicgenConfig``)."""
    want = getattr(head, "config_class", None)  # a model class
    if want is None:
        try:
            want = head._model_mapping[type(config)].config_class
        except Exception:  # noqa: BLE001 - no mapping for this config: built from it as is
            return config
    if isinstance(config, want):
        return config
    return next((v for v in vars(config).values() if isinstance(v, want)), config)


def tiny(model_type: str, head: Any) -> Tiny:
    """The tiny config of ``model_type`` for the model class ``head`` (an auto class or a model class)."""
    from transformers import AutoConfig

    default = _for_head(AutoConfig.for_model(model_type), head)
    full_depth = _depth(default) or 2
    full = shrunk(default, full_depth)
    want = _kinds(meta_model(head, full), full)
    best: Tiny | None = None
    failure: Exception | None = None
    for depth in range(min(2, full_depth), min(full_depth, MAX_DEPTH) + 1):
        try:  # some depths cannot be built (Gemma 3n's shared-cache layers need layers to share from)
            config = shrunk(default, depth)
            model = meta_model(head, config)
        except Exception as e:  # noqa: BLE001 - the next depth may build; the first failure is the reason
            failure = failure or e
            continue
        have = _kinds(model, config)
        if best is None or len(want & have) > len(best.kinds):
            best = Tiny(config, depth, frozenset(want & have), sum(p.numel() for p in model.parameters()))
        if have >= want:
            break
    if best is None:
        assert failure is not None
        raise failure
    return best


def named_kinds(kinds: frozenset[str]) -> list[str]:
    """The layer kinds worth a word in the table: layer types, experts, mamba, linear attention."""
    named = sorted(k.split(":", 1)[1] for k in kinds if k.startswith("layer_types:"))
    for word, pattern in KIND_PATTERNS.items():
        if any(pattern.search(k) for k in kinds if ":" not in k):
            named.append(word)
    return named
