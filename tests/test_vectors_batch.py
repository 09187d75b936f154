"""The follower quantises a batch's vectors at once (``Vectors.prepare``) and copies each
row in as its event applies: the bytes must be those of quantising each vector alone (as
``Vectors.install`` does when filling in), or answers would depend on how the log was
batched."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from kbgraph.graphalgo.vectors import quantize

floats = st.floats(-4.0, 4.0, width=32, allow_subnormal=False) | st.sampled_from([0.0, -0.0])


@settings(max_examples=40)
@given(
    batch=st.integers(1, 6).flatmap(
        lambda n: st.sampled_from([3, 128, 200, 256]).flatmap(
            lambda d: arrays(np.float32, (n, d), elements=floats)
        )
    )
)
def test_a_batch_quantised_at_once_equals_each_row_alone(batch: np.ndarray) -> None:
    q8, scale, codes = quantize(batch)
    for row in range(len(batch)):
        alone = quantize(batch[row][None, :])
        assert q8[row].tobytes() == alone[0][0].tobytes()
        assert scale[row].tobytes() == alone[1][0].tobytes()
        assert codes[row].tobytes() == alone[2][0].tobytes()
