"""What qkv checks in a local model folder before transformers reads any of it.

Three refusals that transformers would otherwise turn into a prompt, a traceback or running
the folder's own code: a ``config.json`` that is not a JSON object (or is nested too deeply for
the parser), a config whose ``auto_map`` names Python classes of the folder for a
``model_type`` transformers does not know (loading it would mean importing and running that
code: qkv never does), and weights kept only as pickles (``pytorch_model.bin``, ``*.pt``...:
unpickling can run arbitrary code, so qkv reads ``*.safetensors`` only). Pure functions of the
folder's files; no transformers import here.
"""

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from ._errors import ModelError

CONFIG = "config.json"
PICKLES = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle")
"""Weight files that are Python pickles (``torch.save``): never opened."""


def read_config(folder: Path, name: str) -> dict[str, Any]:
    """The folder's ``config.json`` as a dict; ``ModelError`` (one line, naming the file) if it is
    not readable UTF-8 JSON, is nested too deeply to parse, or is not a JSON object."""
    path = folder / CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise ModelError(f"{path} of model {name!r} is nested too deeply to read as JSON") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path} of model {name!r} is not valid JSON: {e}") from None
    except OSError as e:
        raise ModelError(f"cannot read {path} of model {name!r}: {e.strerror or e}") from None
    if not isinstance(config, dict):
        raise ModelError(f"{path} of model {name!r} must hold a JSON object, got a JSON {type(config).__name__}")
    return config


def custom_code_problem(config: dict[str, Any], known_types: Collection[str], folder: Path, name: str) -> str | None:
    """Why the folder cannot be loaded without running its own Python code, or None.

    transformers loads a config with an ``auto_map`` through its built-in classes when it knows
    the ``model_type`` (``trust_remote_code=False``); only an unknown type needs the folder's code.
    """
    auto_map = config.get("auto_map")
    model_type = config.get("model_type")
    if not auto_map or (isinstance(model_type, str) and model_type in known_types):
        return None
    modules = sorted({str(v).split(".")[0] + ".py" for v in _values(auto_map)})[:3]
    return (
        f"model {name!r} ({folder}) can only be loaded by running its own Python code "
        f"(config.json's auto_map names {', '.join(modules) or 'its classes'} for model_type "
        f"{str(model_type)[:40]!r}, which transformers does not know); qkv never runs code from a model folder: "
        "give a model whose model_type transformers supports"
    )


def _values(auto_map: Any) -> list[Any]:
    if isinstance(auto_map, dict):
        return [x for v in auto_map.values() for x in (v if isinstance(v, list) else [v]) if x]
    return []


def pickle_only_problem(folder: Path, name: str) -> str | None:
    """Why the folder's weights cannot be read safely (only pickles, no ``*.safetensors``), or None."""
    if any(folder.glob("*.safetensors")):
        return None
    pickles = sorted(p.name for pattern in PICKLES for p in folder.glob(pattern))
    if not pickles:
        return None
    return (
        f"model {name!r} ({folder}) keeps its weights only as {', '.join(pickles[:3])}, a Python pickle that qkv "
        "never loads (unpickling can run code): convert it to model.safetensors where you trust the file "
        "(transformers' save_pretrained writes one)"
    )
