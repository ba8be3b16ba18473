"""qkv.train: each toy task reaches near-perfect held-out accuracy within its default step budget (seeded,
2 CPU threads, seconds each); attention maps are recorded; ``qkv train`` runs from the command line."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from qkv.errors import ArgumentError  # noqa: E402
from qkv.train import TASKS, make_batch, train  # noqa: E402


@pytest.fixture(autouse=True)
def two_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("task", list(TASKS))
def test_each_task_reaches_its_threshold_within_its_budget(task, dtype):
    history = train(task, seed=0, dtype=dtype)
    assert len(history.loss) == TASKS[task].default_steps
    assert history.eval_accuracy >= 0.99, f"{task}: held-out answer-token accuracy {history.eval_accuracy:.4f}"
    assert history.eval_exact >= 0.95, f"{task}: whole answers right {history.eval_exact:.4f}"
    assert history.loss[-1] < history.loss[0] / 10


def test_the_tasks_are_what_they_say(rng):
    g = torch.Generator().manual_seed(0)
    for name, check in (
        ("copy", lambda x, a: a == x),
        ("reverse", lambda x, a: a == x[::-1]),
        ("sort", lambda x, a: a == sorted(x)),
    ):
        tokens, answer = make_batch(name, 4, 5, g)
        assert tokens.shape == (4, 11) and answer.tolist() == list(range(6, 11))
        for row in tokens.tolist():
            assert row[5] == 10 and check(row[:5], row[6:])
    tokens, answer = make_batch("recall", 4, 3, g)
    assert tokens.shape == (4, 13) and answer.tolist() == [8, 10, 12]
    for row in tokens.tolist():
        pairs = dict(zip(row[0:6:2], row[1:6:2], strict=True))
        assert len(pairs) == 3 and row[6] == 32
        assert sorted(row[7::2]) == sorted(pairs) and all(
            pairs[k] == v for k, v in zip(row[7::2], row[8::2], strict=True)
        )


def test_records_attention_maps_and_calls_back():
    seen = []
    history = train("copy", 20, length=4, record_every=8, seed=3, callback=seen.append)
    assert [s.step for s in history.attention] == [0, 8, 16, 20]
    t = len(history.probe) - 1  # the model reads all but the last token
    for snap in history.attention:
        assert len(snap.weights) == 2 and snap.weights[0].shape == (4, t, t)
        np.testing.assert_allclose(snap.weights[1].sum(-1), 1.0, rtol=1e-5)
        assert np.allclose(np.triu(snap.weights[0], 1), 0)  # causal
    assert [s["step"] for s in seen] == list(range(1, 21))
    assert "attention" in seen[7] and "attention" not in seen[8]
    d = history.to_dict()
    assert json.loads(json.dumps(d))["attention"][1]["step"] == 8


def test_a_callback_returning_false_stops_training_early():
    seen = []

    def stop_at_5(info):
        seen.append(info["step"])
        return info["step"] < 5  # False at step 5; None and True keep going

    history = train("copy", 12, length=3, record_every=2, seed=0, callback=stop_at_5)
    assert seen == [1, 2, 3, 4, 5]
    assert len(history.loss) == len(history.accuracy) == 5
    assert [s.step for s in history.attention] == [0, 2, 4]
    assert 0.0 <= history.eval_accuracy <= 1.0  # the partial model is still evaluated
    full = train("copy", 12, length=3, seed=0, callback=lambda info: None)
    assert len(full.loss) == 12 and full.loss[:5] == history.loss  # nothing changes before the stop


def test_training_is_seeded_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a = train("reverse", 5, length=3, seed=1)
    after = torch.rand(3)
    assert torch.equal(before, after)
    b = train("reverse", 5, length=3, seed=1)
    c = train("reverse", 5, length=3, seed=2)
    assert a.loss == b.loss and a.loss != c.loss


def test_bfloat16_training_runs_attention_and_its_backward_in_bfloat16(monkeypatch):
    """``dtype="bfloat16"``: every attention call of the training steps gets bfloat16 q, k, v that
    need gradients (qkv's bfloat16 forward and backward), the weights stay float32 and learn."""
    from qkv.nn import attention as nn_attention

    real, seen = nn_attention.attention, []

    def spy(q, k, v, **kw):
        seen.append((q.dtype, k.dtype, v.dtype, torch.is_grad_enabled() and q.requires_grad))
        return real(q, k, v, **kw)

    monkeypatch.setattr(nn_attention, "attention", spy)
    history = train("copy", 24, length=4, seed=0, dtype="bfloat16")
    training = [s for s in seen if s[3]]
    assert len(training) == 24 * 2  # every step, both layers
    assert all(s[:3] == (torch.bfloat16,) * 3 for s in seen)  # evaluation too
    assert all(p.dtype == torch.float32 for p in history.model.parameters())
    assert all(np.isfinite(history.loss)) and history.loss[-1] < 0.8 * history.loss[0]


def test_bad_arguments_raise():
    with pytest.raises(ArgumentError, match="task must be one of"):
        train("translate", 5)
    with pytest.raises(ArgumentError, match="steps"):
        train("copy", 0)
    with pytest.raises(ArgumentError, match="record_every"):
        train("copy", 5, record_every=0)
    with pytest.raises(ArgumentError, match=r"length \(the number of pairs\) must be <= 16"):
        train("recall", 5, length=17)
    with pytest.raises(ArgumentError, match=r"dtype must be one of \['float32', 'bfloat16'\], got 'float16'"):
        train("copy", 5, dtype="float16")


def _app():
    from qkv.cli import app

    return app


def test_cli_json_save_and_errors(tmp_path):
    runner = CliRunner()
    out = tmp_path / "run.npz"
    res = runner.invoke(
        _app(),
        [
            "train",
            "--task",
            "sort",
            "--steps",
            "6",
            "--length",
            "4",
            "--record-every",
            "3",
            "--save",
            str(out),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["task"] == "sort" and len(d["loss"]) == 6 and [a["step"] for a in d["attention"]] == [0, 3, 6]
    saved = np.load(out)
    assert saved["attention_layer0"].shape == (3, 4, 8, 8) and saved["loss"].shape == (6,)
    res = runner.invoke(_app(), ["train", "--task", "copy", "--steps", "3", "--length", "3"])
    assert res.exit_code == 0 and "held-out accuracy" in res.stdout
    res = runner.invoke(_app(), ["train", "--task", "nope"])
    assert res.exit_code == 1 and "error: ArgumentError: task must be one of" in res.output
    res = runner.invoke(_app(), ["train", "--task", "copy", "--steps", "3", "--length", "3", "--dtype", "bfloat16"])
    assert res.exit_code == 0 and "held-out accuracy" in res.stdout
    res = runner.invoke(_app(), ["train", "--task", "copy", "--steps", "3", "--dtype", "float16"])
    assert res.exit_code == 1 and "dtype must be one of ['float32', 'bfloat16']" in res.output
