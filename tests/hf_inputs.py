"""The inputs each transformers model class takes, made from its tiny config.

``candidates(model, config, padded, g)`` reads the class's ``main_input_name`` and its forward's
signature and yields input sets, the likeliest first: token ids with a padding mask, pixel values
(``num_channels`` x ``image_size`` of the vision config) and clips of frames, audio features or
raw waveforms, an audio or vision LM's clips and images behind as many placeholder tokens as the
model's own features of them, bounding boxes, image grids, time series, embeddings where a model
takes them instead of ids (a Q-Former's queries); decoder ids for encoder-decoders (never for
decoder-only models); both sides of vision-text models. ``prepare`` sets what a processor or user
sets before the first forward (X-MOD's language). The sweep takes the first set eager accepts, so a layout a model reads
differently (``(B, mel, frames)`` for Whisper, ``(B, frames, features)`` for Speech2Text) is found,
not guessed per model.
"""

import inspect
import math
from collections.abc import Iterator
from typing import Any

B, SEQ, PAD, DEC = 2, 9, 3, 5
IMAGE = 32
"""Images are ``IMAGE x IMAGE`` pixels (the shrunk ``image_size``)."""
SPECIAL = 16
"""The top ``SPECIAL`` token ids are kept for special tokens (image, audio, video placeholders):
text ids are drawn below them."""


def _sub(config: Any, *names: str) -> Any:
    for name in names:
        sub = getattr(config, name, None)
        if sub is not None and hasattr(sub, "to_dict"):
            return sub
    return config


def _int(config: Any, *names: str, default: int) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], int):
            value = value[0]
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def vocab(config: Any) -> int:
    text = _sub(config, "text_config", "decoder", "language_config", "llm_config")
    return _int(text, "vocab_size", default=_int(config, "vocab_size", default=128))


def _ids(config: Any, g: Any, length: int = SEQ) -> Any:
    import torch

    top = max(vocab(config) - SPECIAL, 4)
    return torch.randint(3, top, (B, length), generator=g)


def _padding(length: int, padded: str) -> Any:
    import torch

    am = torch.ones(B, length, dtype=torch.long)
    if padded == "left":
        am[1, :PAD] = 0
    elif padded == "right":
        am[1, -PAD:] = 0
    return am


def _pixels(config: Any, g: Any, size: int | None = None) -> Any:
    import torch

    vision = _sub(config, "vision_config", "image_config", "backbone_config", "encoder")
    channels = _int(vision, "num_channels", "in_channels", "input_channels", default=3)
    side = size or _int(vision, "image_size", "img_size", default=IMAGE)
    return torch.randn(B, channels, side, side, generator=g)


def _video(config: Any, g: Any) -> Any | None:
    """A clip ``(B, frames, C, H, W)`` for a model whose config counts frames (None: it does not)."""
    names = ("num_frames", "frames_per_clip")
    frames = _int(_sub(config, "vision_config"), *names, default=0) or _int(config, *names, default=0)
    return _pixels(config, g)[:, None].expand(-1, frames, -1, -1, -1).clone() if frames else None


def _boxes(config: Any, length: int, g: Any) -> Any:
    """Boxes ``(B, length, 4)`` as ``x0 y0 x1 y1`` within the model's coordinate range
    (``max_2d_position_embeddings``: 1000 for a checkpoint, its shrunk size here)."""
    import torch

    limit = _int(config, "max_2d_position_embeddings", default=1000)
    corner = torch.randint(0, limit // 2, (B, length, 2), generator=g)
    extent = torch.randint(1, limit // 2, (B, length, 2), generator=g)
    return torch.cat([corner, corner + extent], -1)


def _audio_features(config: Any, g: Any, with_frames: bool = False) -> Iterator[Any]:
    """Audio features ``(B, mel, frames)`` and ``(B, frames, mel)`` (each with its frame count when
    ``with_frames``): the layouts models read."""
    import torch

    audio = _sub(
        config, "audio_config", "encoder_config", "speech_config", "encoder", "asr_config", "semantic_model_config"
    )
    names = ("num_mel_bins", "feature_size", "n_mels", "input_feat_size", "input_dim", "n_mel_bins")
    mel = _int(audio, *names, default=80)
    per_channel = getattr(audio, "input_feat_per_channel", None)
    if isinstance(per_channel, int):
        mel = per_channel * _int(audio, "input_channels", default=1)
    frames = 2 * _int(audio, "max_source_positions", default=32)
    shapes = [(mel, frames, frames), (frames, mel, frames), (mel, 64, 64), (64, mel, 64)]
    window = _int(audio, "n_window", default=0)  # Qwen3-ASR reads whole windows of 2 x n_window frames
    if window:
        shapes.append((mel, 2 * window, 2 * window))
    for k in sorted({2, 4, _int(audio, "num_stacked_frames", default=2)}):  # k frames stacked per step
        shapes.append((9 * k, k * mel, 9 * k))  # (Granite Speech 5's 4 x 80, Fun-ASR's 7 x 80)
    projected = _int(audio, "feature_projection_input_dim", default=0)  # stacked frames (w2v-BERT's 2 x 80)
    if projected and projected != mel:
        shapes.append((64, projected, 64))
    for a, b, n in shapes:
        f = torch.randn(B, a, b, generator=g)
        yield (f, n) if with_frames else f


def _grid_pixels(
    config: Any, g: Any, temporal: int | None = None, square: bool = False, blocks: bool = False
) -> dict[str, Any]:
    """Qwen2-VL-style images: flattened patches ``(B * t * h * w, C * tp * p * p)`` and their grid
    ``image_grid_thw (B, 3)``, one image of ``1 x 4 x 4`` patches (times the merge size) per sequence;
    ``temporal`` patches of frames (default: the config's, else 2), ``square``: each patch
    ``(C, p, p)`` (Kimi K2.5's), ``blocks``: each merged token's pixels ``(m * p, m * p, C)``
    and the grid in merged tokens (Inkling 2's)."""
    import torch

    vision = _sub(config, "vision_config")
    merge = _int(vision, "spatial_merge_size", "merge_kernel_size", default=2)
    patch = _int(vision, "patch_size", "spatial_patch_size", default=14)
    temporal = temporal or _int(vision, "temporal_patch_size", default=2)
    channels = _int(vision, "in_channels", "in_chans", "num_channels", default=3)
    side = 2 * merge
    grid = torch.tensor([[1, side, side]] * B)
    shape = (channels, patch, patch) if square else (channels * temporal * patch * patch,)
    pixels = torch.randn(B * side * side, *shape, generator=g)
    if blocks:  # the grid counted in merged tokens
        pixels = torch.randn(B * side * side // merge**2, merge * patch, merge * patch, channels, generator=g)
        grid = torch.tensor([[1, side // merge, side // merge]] * B)
    return {"pixel_values": pixels, "image_grid_thw": grid}


def _image_sets(config: Any, params: set[str], g: Any) -> Iterator[dict[str, Any]]:
    """One image per sequence in the layouts vision-language models take: a grid of flattened
    patches (Qwen2-VL), ``(B, C, H, W)`` (with its size where the forward asks, LLaVA-NeXT), or
    ``(B, images, C, H, W)`` (Idefics 3)."""
    import torch

    if "image_grid_thw" in params:
        yield _grid_pixels(config, g)
        yield _grid_pixels(config, g, temporal=1)  # an image is one frame (ERNIE 4.5 VL merges frames later)
        return
    pixels = _pixels(config, g)
    yield {"pixel_values": pixels}
    if "image_sizes" in params:
        yield {"pixel_values": pixels, "image_sizes": torch.tensor([list(pixels.shape[-2:])] * B)}
    yield {"pixel_values": pixels[:, None]}


def media_token(config: Any, kind: str = "image") -> int | None:
    """The id standing for one image (audio) feature in the text (None: the model has none)."""
    for name in (f"{kind}_token_id", f"{kind}_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def _features(model: Any, media: dict[str, Any], kind: str = "image") -> int | None:
    """How many text positions the images (audio clips) of one sequence fill: the model's own
    ``get_image_features`` (``get_audio_features``) says."""
    import torch

    tower = next((m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] == f"{kind}_tower"), None)
    get = getattr(model, f"get_{kind}_features", None) or tower  # Qwen2-Audio has only its tower
    if get is None:
        return None
    if isinstance(get, torch.nn.Module):
        get = get.forward
    takes = set(inspect.signature(get).parameters)
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(get).parameters.values()):
        media = {k: v for k, v in media.items() if k in takes}
    with torch.no_grad():
        try:
            out = get(**{k: v for k, v in media.items() if k != "image_sizes"})
        except Exception:  # noqa: BLE001 - this model's features need the image sizes (LLaVA-NeXT)
            out = get(**media)
    if not isinstance(out, (torch.Tensor, list, tuple)):
        out = getattr(out, "pooler_output", None) if getattr(out, "pooler_output", None) is not None else out[0]
    feats = out
    if isinstance(feats, (list, tuple)):
        feats = torch.cat([f.reshape(-1, f.shape[-1]) for f in feats])
    if not isinstance(feats, torch.Tensor):
        return None
    return feats.reshape(-1, feats.shape[-1]).shape[0] // B


def _with_images(
    model: Any, config: Any, text: dict[str, Any], images: dict[str, Any], kind: str = "image"
) -> dict[str, Any] | None:
    """``text`` with each sequence's real tokens preceded by its image's (audio clip's) placeholder
    tokens, as many as the model's features of it."""
    import torch

    token = media_token(config, kind)
    if token is None or "input_ids" not in text:
        return None
    try:
        n = _features(model, images, kind)
    except Exception:  # noqa: BLE001 - the model cannot describe its images this way: no image input
        return None
    if not n:
        return None
    ids, am = text["input_ids"], text.get("attention_mask", torch.ones_like(text["input_ids"]))
    left = bool((am[:, 0] == 0).any())  # the padding stays on its side of each sequence's images and text
    new_ids, new_am = [], []
    for s in range(B):
        real, pad = ids[s][am[s].bool()], int((am[s] == 0).sum())
        parts = [torch.zeros(pad, dtype=ids.dtype), torch.full((n,), token, dtype=ids.dtype), real]
        flags = [torch.zeros(pad, dtype=am.dtype), torch.ones(n + len(real), dtype=am.dtype)]
        new_ids.append(torch.cat(parts if left else parts[1:] + parts[:1]))
        new_am.append(torch.cat(flags if left else flags[::-1]))
    new_ids, new_am = torch.stack(new_ids), torch.stack(new_am)
    out = {**text, "input_ids": new_ids, **images}
    if kind == "image" and "mm_token_type_ids" in signature(model):  # Qwen2-VL's multimodal RoPE
        out["mm_token_type_ids"] = (new_ids == token).long()
    if "attention_mask" in text:
        out["attention_mask"] = new_am
    return out


def _audio_sets(params: set[str], config: Any, g: Any) -> Iterator[dict[str, Any]]:
    """One clip of audio features per sequence, in each layout ``_audio_features`` tries, with
    every frame real where the forward takes a features mask."""
    import torch

    for f, frames in _audio_features(config, g, with_frames=True):
        side = {"input_features": f}
        for name in ("feature_attention_mask", "input_features_mask"):
            if name in params:
                side[name] = torch.ones(B, frames, dtype=torch.long)
        yield side


def _other_sides(config: Any, params: set[str], main: str, padded: str, g: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Inputs of models that read neither text nor images nor audio as such: embeddings in place
    of token ids (a Q-Former's queries, a decoder fed another model's states), time series."""
    import torch

    if main.endswith("embeds") and main in params:
        width = _int(_sub(config, "text_config", "qformer_config"), "hidden_size", "d_model", default=32)
        side = {main: torch.randn(B, SEQ, width, generator=g)}
        if "attention_mask" in params:
            side["attention_mask"] = _padding(SEQ, padded)
        yield ("embeddings", side)
        if "encoder_hidden_states" in params:  # cross-attention to another model's states (BLIP-2's Q-Former)
            memory = _int(config, "encoder_hidden_size", "hidden_size", default=width)
            yield ("embeddings + memory", {**side, "encoder_hidden_states": torch.randn(B, SEQ, memory, generator=g)})
    if main == "latents" or (main == "hidden_states" and "padding_cache" in params):  # codec decoders, encoders
        width = _int(config, "latent_dim", "hidden_size", default=32)
        yield ("latent frames", {main: torch.randn(B, width, 8, generator=g)})
        if main == "hidden_states":  # VibeVoice's tokenizer encoder: the waveform
            channels = _int(config, "channels", "audio_channels", default=1)
            yield ("waveform 4000", {main: torch.randn(B, channels, 4000, generator=g)})
    if main == "audio_mel" and main in params:  # Gemma 3n's audio encoder: mel frames, True where padded
        mel = _int(config, "input_feat_size", default=128)
        frames = {main: torch.randn(B, 64, mel, generator=g), "audio_mel_mask": torch.zeros(B, 64, dtype=torch.bool)}
        yield ("audio features", frames)
    if {"states", "actions", "returns_to_go", "timesteps"} <= params:  # Decision Transformer's trajectories
        state, action = _int(config, "state_dim", default=4), _int(config, "act_dim", default=2)
        trajectory = {
            "states": torch.randn(B, SEQ, state, generator=g),
            "actions": torch.randn(B, SEQ, action, generator=g),
            "rewards": torch.randn(B, SEQ, 1, generator=g),
            "returns_to_go": torch.randn(B, SEQ, 1, generator=g),
            "timesteps": torch.arange(SEQ).expand(B, -1).clone(),
            "attention_mask": _padding(SEQ, padded),
        }
        yield ("trajectories", trajectory)
    if main == "past_values" and main in params:
        length = _int(config, "context_length", default=64)
        channels = _int(config, "num_input_channels", "input_size", default=1)
        padding = {n: torch.zeros(B, length, dtype=torch.long) for n in ("past_values_padding",) if n in params}
        if "freq" in params:  # TimesFM's frequency class of each series
            padding["freq"] = torch.zeros(B, 1, dtype=torch.long)
        if "past_time_features" in params:  # a forecaster (Informer): lagged history, features, the future
            ahead = _int(config, "prediction_length", default=4)
            lags = getattr(config, "lags_sequence", None) or [0]
            length = _int(config, "context_length", default=ahead) + max(lags)
            features = getattr(config, "num_time_features", 1)
            yield (
                "time series",
                {
                    main: torch.randn(B, length, generator=g),
                    "past_time_features": torch.randn(B, length, features, generator=g),
                    "past_observed_mask": torch.ones(B, length),
                    "future_values": torch.randn(B, ahead, generator=g),
                    "future_time_features": torch.randn(B, ahead, features, generator=g),
                },
            )
        yield ("time series", {main: torch.randn(B, length, channels, generator=g), **padding})
        yield ("time series", {main: torch.randn(B, length, generator=g), **padding})
        yield ("time series", {main: list(torch.randn(B, length, generator=g))})


class Fresh:
    """An input made anew for every forward, by the model it is for: a video session, whose state
    the model changes as it runs."""

    def __init__(self, make: Any) -> None:
        self.make = make


def fresh(kw: dict[str, Any], model: Any) -> dict[str, Any]:
    """``kw`` with every ``Fresh`` input made for ``model``."""
    return {k: v.make(model) if isinstance(v, Fresh) else v for k, v in kw.items()}


def _video_session(model: Any, config: Any, g: Any) -> dict[str, Any] | None:
    """A SAM 2-style video session (``inference_session``) for its first frame: two frames of the
    vision tower's image size, one object prompted by a point on the first (SAM 3's by a text
    prompt), as its processor adds it; None when the model's module has no session class. (Not the
    second frame, whose memory attention reads the first: the tiny configs' memory widths do not
    join, 3-D memories beside 4-D object pointers.)"""
    import sys

    import torch

    module = sys.modules[type(model).__module__]
    session = next((getattr(module, n) for n in dir(module) if n.endswith("InferenceSession")), None)
    if session is None or not (hasattr(session, "add_point_inputs") or hasattr(session, "add_prompt")):
        return None
    vision = _sub(config, "vision_config")
    side = _int(_sub(vision, "backbone_config"), "image_size", default=0) or _int(vision, "image_size", default=64)
    video = torch.randn(2, 3, side, side, generator=g)
    prompt = torch.randint(3, 64, (1, 8), generator=g)

    def make(model: Any) -> Any:
        made = session(video=video, video_height=side, video_width=side, dtype=torch.float32)
        if not hasattr(made, "add_point_inputs"):  # SAM 3 video: objects found by a text prompt, tokenized
            found = made.add_prompt("an object")  # and padded as its processor pads it (here to 8)
            made.prompt_input_ids[found] = prompt
            made.prompt_attention_masks[found] = torch.tensor([[1] * 6 + [0] * 2])
            return made
        obj = made.obj_id_to_idx(1)
        point = {
            "point_coords": torch.tensor([[[[side / 2, side / 3]]]]),
            "point_labels": torch.ones(1, 1, 1, dtype=torch.int32),
        }
        made.add_point_inputs(obj, 0, point)
        made.obj_with_new_inputs = [1]
        return made

    return {"inference_session": Fresh(make), "frame_idx": 0}


def prepare(model: Any) -> None:
    """What a model needs set before its first forward, as its processor or a user sets it: the
    language of X-MOD's adapters."""
    languages = getattr(model.config, "languages", None)
    if hasattr(model, "set_default_language") and languages:
        model.set_default_language(list(languages)[0])


def signature(model: Any) -> set[str]:
    return set(inspect.signature(model.forward).parameters)


def is_encoder_decoder(config: Any) -> bool:
    return bool(getattr(config, "is_encoder_decoder", False))


def candidates(model: Any, config: Any, padded: str, g: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(description, kwargs)`` input sets for ``model``'s forward, the likeliest first."""
    import torch

    params = signature(model)
    main = getattr(model, "main_input_name", "input_ids")
    text: dict[str, Any] = {}
    if "input_ids" in params:
        text["input_ids"] = _ids(config, g)
        am = _padding(SEQ, padded if "attention_mask" in params else "none")
        eos = getattr(config, "eos_token_id", None)
        if not isinstance(eos, int):
            eos = getattr(_sub(config, "text_config", "decoder"), "eos_token_id", None)
        if isinstance(eos, int):  # each sequence ends as a tokenizer ends it (CLIP-style towers pool there)
            last = am.cumsum(-1).argmax(-1)
            text["input_ids"][torch.arange(B), last] = eos
        if "attention_mask" in params:
            text["input_ids"] = text["input_ids"].masked_fill(am == 0, 0)
            text["attention_mask"] = am
        if "bbox" in params:
            text["bbox"] = _boxes(config, SEQ, g)
        slots = _int(config, "latent_query_num", default=0)
        if "image_embeds_position_mask" in params and slots:  # Kosmos-2: the image's tokens after the first
            first = (am == 0).long().argmin(-1) if "attention_mask" in params else torch.zeros(B, dtype=torch.long)
            where = torch.arange(SEQ)[None] - first[:, None]
            text["image_embeds_position_mask"] = ((where >= 1) & (where <= slots)).long()
        if "qformer_input_ids" in params:  # InstructBLIP's instruction, read by its Q-Former too
            text["qformer_input_ids"] = text["input_ids"]
            if "qformer_attention_mask" in params and "attention_mask" in text:
                text["qformer_attention_mask"] = text["attention_mask"]
    if is_encoder_decoder(config) and "decoder_input_ids" in params:
        text["decoder_input_ids"] = _ids(config, g, DEC)
    if "pixel_values" in params and "input_ids" in text:
        for images in _image_sets(config, params, g):
            both = _with_images(model, config, text, images)
            if both is not None:
                yield ("text + image", both)
    if "action_embeds" in params and "input_ids" in text:  # PI0: a prompt with a camera's image (its
        vlm = _sub(config, "vlm_config")  # vision-language model's), then a robot's state and noisy actions
        pixels = _pixels(vlm, g)
        both = _with_images(getattr(model, "vlm", model), vlm, text, {"pixel_values": pixels})
        if both is not None:
            width = _int(_sub(config, "dit_config"), "hidden_size", default=32)  # its action expert's width
            both["pixel_values"], both["pixel_attention_mask"] = pixels[:, None], torch.ones(B, 1, dtype=torch.bool)
            yield ("text + image + actions", {**both, "action_embeds": torch.randn(B, 4, width, generator=g)})
    if "image_attention_mask" in params and "pixel_values" in params and "input_ids" in text:
        # IDEFICS: one image per sequence, (B, images, C, H, W), that every real token may attend
        am = text.get("attention_mask", torch.ones_like(text["input_ids"]))
        image = {"pixel_values": _pixels(config, g)[:, None], "image_attention_mask": am[..., None].clone()}
        yield ("text + image", {**text, **image})
    if "input_features" in params and "input_ids" in text and media_token(config, "audio") is not None:
        for audio in _audio_sets(params, config, g):  # an audio LM: its clips' placeholders in the text
            both = _with_images(model, config, text, audio, "audio")
            if both is not None:
                yield ("text + audio", both)
    if text and (main == "input_ids" or main not in params):
        yield ("text", text)
    if {"input_features", "encoder_inputs_embeds"} <= params and "input_ids" in text:
        # a streaming audio LM (Voxtral realtime): its audio encoder's 8 frames per text token, beside the text
        mel = _int(_sub(config, "audio_config"), "num_mel_bins", default=128)
        yield ("text + aligned audio", {**text, "input_features": torch.randn(B, mel, 8 * SEQ, generator=g)})
    channels = (
        _int(_sub(config, "decoder_config"), "num_channels", default=0) if "decoder_config" in vars(config) else 0
    )
    if channels > 1 and "decoder_input_ids" in text:  # Dia's decoder: a code per audio channel, (B, Nq, channels)
        codes = torch.randint(3, max(vocab(config) - SPECIAL, 4), (B, DEC, channels), generator=g)
        yield ("text, channel codes", {**text, "decoder_input_ids": codes})
    codebooks = _int(config, "num_codebooks", default=0)
    if codebooks > 1 and "input_ids" in text:  # MusicGen's decoder: a row of ids per codebook, (B * K, Nq)
        ids = torch.randint(3, max(vocab(config) - SPECIAL, 4), (B * codebooks, SEQ), generator=g)
        if "attention_mask" in text:
            ids = ids.masked_fill(text["attention_mask"].repeat_interleave(codebooks, 0) == 0, 0)
        yield ("codebook ids", {**text, "input_ids": ids})
        # Kyutai's speech-to-text: a text id and a code per codebook at each step, (B, Nq, 1 + K)
        steps = torch.randint(3, max(vocab(config) - SPECIAL, 4), (B, SEQ, 1 + codebooks), generator=g)
        steps[..., 0] = text["input_ids"]
        yield ("text + codes per step", {**text, "input_ids": steps})
    first = next(iter(inspect.signature(model.forward).parameters), main)  # BLIP-2's Q-Former: not main_input_name
    sides: list[tuple[str, dict[str, Any]]] = list(
        _other_sides(config, params, main if main in params else first, padded, g)
    )
    grid_name = next((n for n in ("grid_thw", "image_grid_thw") if n in params), None)
    if grid_name is not None and "input_ids" not in params:  # a vision tower of flattened patches (Qwen2-VL's)
        pixels = next((n for n in ("hidden_states", "pixel_values") if n in params), "pixel_values")
        layouts = ({}, {"temporal": 1}, {"temporal": 1, "square": True}, {"blocks": True})  # frames per patch
        for layout in layouts:
            grid = _grid_pixels(config, g, **layout)
            side = {pixels: grid["pixel_values"], grid_name: grid["image_grid_thw"]}
            if "merge_sizes" in params:
                merge = _int(_sub(config, "vision_config"), "spatial_merge_size", default=2)
                side["merge_sizes"] = torch.full((B,), merge)
            sides.append(("image patches", side))
    if "pixel_position_ids" in params and "input_ids" not in params:  # Gemma 4's vision tower: patches and their (x, y)
        vision = _sub(config, "vision_config")
        patch, channels = _int(vision, "patch_size", default=16), _int(vision, "num_channels", default=3)
        ys, xs = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
        where = torch.stack([xs.flatten(), ys.flatten()], -1)[None].expand(B, -1, -1).clone()
        patches = torch.randn(B, 36, channels * patch * patch, generator=g)
        sides.append(("image patches", {"pixel_values": patches, "pixel_position_ids": where}))
    if "target_sizes" in params and "input_ids" not in params:  # MiniCPM's vision tower: images packed in one row
        vision = _sub(config, "vision_config")
        patch, channels = _int(vision, "patch_size", default=14), _int(vision, "num_channels", default=3)
        packed = torch.randn(1, channels, patch, 2 * 16 * patch, generator=g)  # two images of 4 x 4 patches
        sides.append(("packed image patches", {"pixel_values": packed, "target_sizes": torch.tensor([[4, 4]] * 2)}))
    if "spatial_shapes" in params and "pixel_attention_mask" in params:  # SigLIP 2's patches of any shape
        vision = _sub(config, "vision_config")
        patch, channels = _int(vision, "patch_size", default=16), _int(vision, "num_channels", default=3)
        n = _int(vision, "num_patches", default=16)
        shapes = torch.tensor([[4, n // 4]] * B)
        side = {
            "pixel_values": torch.randn(B, n, channels * patch * patch, generator=g),
            "pixel_attention_mask": torch.ones(B, n, dtype=torch.long),
            "spatial_shapes": shapes,
        }
        sides.append(("image patches", side))
    if "pixel_values_videos" in params and "pixel_values" not in params:  # a video encoder (V-JEPA 2, VideoPrism)
        video = _video(config, g)
        sides += [("video", {"pixel_values_videos": video})] if video is not None else []
    if "pixel_values" in params:
        video = _video(config, g)
        sides += [("video", {"pixel_values": video})] if video is not None else []
        sides += [
            ("pixels", {"pixel_values": _pixels(config, g)}),
            ("pixels 64", {"pixel_values": _pixels(config, g, 64)}),
            ("pixels 256", {"pixel_values": _pixels(config, g, 256)}),  # Depth Pro's 4 x 4 patches of 64
            ("video of 2 frames", {"pixel_values": _pixels(config, g)[:, None].expand(-1, 2, -1, -1, -1).clone()}),
        ]
    if "shared_kv_states" in params:  # a draft model (Gemma 4's assistant): its main model's last keys and
        kv = {}  # values per layer type, shaped as its own attention layers read them, and the main model's states
        for m in model.modules():
            kind, head, groups = (getattr(m, n, None) for n in ("layer_type", "head_dim", "num_key_value_groups"))
            if isinstance(kind, str) and isinstance(head, int) and isinstance(groups, int) and kind not in kv:
                heads = m.config.num_attention_heads // groups
                kv[kind] = tuple(torch.randn(B, heads, SEQ, head, generator=g) for _ in "kv")
        width = 2 * _int(config, "backbone_hidden_size", default=32)
        draft = {"inputs_embeds": torch.randn(B, 2, width, generator=g), "shared_kv_states": kv}
        sides.append(("draft states", {**draft, "attention_mask": _padding(SEQ, padded)}))
    if {"noise_embeds", "context_hidden_states"} <= params:  # a block-diffusion draft model (MUSE Glimmer's
        width = _int(config, "hidden_size", default=32)  # assistant): its main model's states at the layers it
        layers = len(getattr(config, "target_layer_ids", None) or [0])  # reads, side by side, then the block
        block = _int(config, "block_size", default=4)  # it denoises; the mask spans both
        am = _padding(SEQ, padded)
        draft = {
            "noise_embeds": torch.randn(B, block, width, generator=g),
            "context_hidden_states": torch.randn(B, SEQ, layers * width, generator=g),
            "attention_mask": torch.cat([am, am.new_ones(B, block)], 1),
        }
        sides.append(("draft states", draft))
    if "inference_session" in params:  # a video model run frame by frame (SAM 2 video)
        session = _video_session(model, config, g)
        sides += [("video session", session)] if session is not None else []
    if "input_values" in params:
        # 3840: whole frames of 1920 samples (MUSE Spark's audio)
        sides += [(f"waveform {n}", {"input_values": torch.randn(B, n, generator=g)}) for n in (4000, 16000, 3840)]
        sides += [("waveform 4000, 1 channel", {"input_values": torch.randn(B, 1, 4000, generator=g)})]  # codecs
        sides += [("spectrogram", {"input_values": f}) for f in _audio_features(config, g)]  # AST's (B, frames, mel)
    if "input_features" in params:
        sides += [("audio features", side) for side in _audio_sets(params, config, g)]
    if {"input_values", "input_features"} <= params:  # a codec reading a clip's waveform and its features
        hop = math.prod(getattr(config, "downsampling_ratios", None) or [1])  # samples per frame: X-Codec 2 joins
        for f, frames in _audio_features(config, g, with_frames=True):  # the two per frame
            side = {"input_values": torch.randn(B, 1, hop * frames, generator=g), "input_features": f}
            if "input_features_mask" in params:
                side["input_features_mask"] = torch.ones(B, frames, dtype=torch.long)
            sides.append(("waveform + audio features", side))
    for what, side in sides:
        if "input_ids" in text:
            yield (f"text + {what}", {**text, **side})
        decoder = {"decoder_input_ids": text["decoder_input_ids"]} if "decoder_input_ids" in text else {}
        yield (what, {**side, **decoder})
