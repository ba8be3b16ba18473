"""The call signature that ranks all-gather before the first transfer (``qkv.distributed._agree``),
in one process: what it encodes, that it always has the same size, and the words of the error;
and the error a failed transfer becomes.

The same code runs on real process groups in ``test_distributed.py`` (the disagreement table);
here the rows every rank would gather are built directly, for the cases a spawn cannot reach
cheaply (shapes with more than 8 axes, floats that differ in the last bit, many ranks).
"""

import math

import pytest

from helpers import HAS_TORCH

pytestmark = pytest.mark.skipif(not HAS_TORCH, reason="qkv.distributed needs torch")


def ring_signature(q_shape, k_shape=None, *, dtype="float64", scale=0.25, causal=False, grad=False):
    import torch

    from qkv.distributed._agree import K_AXES, Q_AXES, V_AXES, Choice, Field, Flag, Real, Signature
    from qkv.distributed._layout import LAYOUTS

    k_shape = k_shape or q_shape
    sig = Signature("ring_attention").add(Field("world_size"), 3)
    for name, shape, axes in (("q", q_shape, Q_AXES), ("k", k_shape, K_AXES), ("v", k_shape, V_AXES)):
        sig.tensor(name, torch.zeros(shape, dtype=getattr(torch, dtype), device="meta"), axes)
    sig.add(Flag("causal"), causal).add(Choice("layout", LAYOUTS), "zigzag").add(Real("scale"), scale)
    return sig.add(Flag("grad"), grad)


def why(*sigs):
    from qkv.distributed._agree import disagreement

    return disagreement(sigs[0], [s.encode() for s in sigs])


def test_every_signature_has_the_same_size_whatever_the_shapes():
    from qkv.distributed._agree import SLOTS

    for shape in [(4, 2), (1, 2, 32, 8), (1,) * 12 + (2, 32, 8)]:
        assert len(ring_signature(shape).encode()) == SLOTS


def test_equal_calls_agree():
    assert why(ring_signature((1, 2, 32, 8)), ring_signature((1, 2, 32, 8)), ring_signature((1, 2, 32, 8))) is None


def test_the_odd_rank_is_named_against_the_majority_with_both_shapes():
    base, odd = ring_signature((1, 2, 32, 8)), ring_signature((1, 2, 32, 8), (1, 2, 16, 8))
    assert why(base, base, odd) == (
        "rank 2 has Nk=16 on axis -2 but ranks 0, 1 have 32 (k: (1, 2, 16, 8) vs (1, 2, 32, 8)); "
        "rank 2 has Nk=16 on axis -2 but ranks 0, 1 have 32 (v: (1, 2, 16, 8) vs (1, 2, 32, 8))"
    )


def test_a_tie_is_told_against_the_group_of_rank_0():
    a, b = ring_signature((1, 2, 8, 8), causal=True), ring_signature((1, 2, 8, 8))
    assert why(b, a, b, a) == "ranks 1, 3 have causal=True but ranks 0, 2 have causal=False"


def test_shapes_beyond_eight_axes_differ_by_their_hash():
    lead = (1,) * 8
    msg = why(ring_signature((*lead, 2, 32, 8)), ring_signature((3, *lead[1:], 2, 32, 8)))
    assert msg is not None and "rank 1 has q differing in an axis before -8" in msg
    assert "(q: (3 more axes, 1, 1, 1, 1, 1, 2, 32, 8) vs (3 more axes, 1, 1, 1, 1, 1, 2, 32, 8))" in msg


def test_scales_are_compared_bit_for_bit():
    msg = why(
        ring_signature((1, 2, 8, 8), scale=0.1), ring_signature((1, 2, 8, 8), scale=math.nextafter(0.1, 1.0))
    )  # one ulp apart
    assert msg == "rank 1 has scale=0.10000000000000002 but rank 0 has scale=0.1"


def test_dtype_names_survive_the_integer_encoding():
    msg = why(ring_signature((1, 2, 8, 8), dtype="bfloat16"), ring_signature((1, 2, 8, 8), dtype="float8_e4m3fnuz"))
    assert msg is not None and "rank 1 has q.dtype=float8_e4m3fnuz but rank 0 has q.dtype=bfloat16" in msg


def test_a_rank_whose_own_checks_failed_is_named_with_its_error_type():
    from qkv.distributed._agree import _failed, disagreement
    from qkv.errors import ShapeError

    ok = ring_signature((1, 2, 8, 8))
    rows = [ok.encode(), _failed("ring_attention", ShapeError("odd shard")), ok.encode()]
    assert disagreement(ok, rows) == "rank 1 rejected its arguments with a ShapeError (its own error says why)"


def test_a_failed_transfer_is_a_distributed_error_naming_the_call_step_and_peers():
    from qkv.distributed import DistributedError
    from qkv.distributed._comm import Group, wait

    class Lost:
        def wait(self):
            raise RuntimeError("Timed out waiting 10000ms for recv operation to complete")

    with pytest.raises(DistributedError) as got:
        wait(Group(None, 0, 3), [Lost()], "forward step 2 of 3, passing K/V blocks on")
    assert str(got.value).startswith(
        "ring_attention: forward step 2 of 3, passing K/V blocks on (rank 0 of 3, sending to rank 1, "
        "receiving from rank 2) failed: a rank of the group died, stopped calling or timed out"
    )
    assert str(got.value).endswith("Timed out waiting 10000ms for recv operation to complete")
    assert isinstance(got.value.__cause__, RuntimeError)
