"""The one blocked pass over the rows (``numpyro_sgd.numerics.row_blocks``) sums every row once,
whatever the number of rows and the block size."""

import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_sgd.numerics.row_blocks import block_size, sum_over_row_blocks


@pytest.mark.parametrize("num_rows, block_rows", [(10, 3), (12, 4), (5, 16), (1, 1), (7, 1)])
def test_every_row_is_summed_once(num_rows, block_rows):
    x = jnp.asarray(np.random.default_rng(0).normal(size=(num_rows, 3)))
    seen = []

    def block(start, size):
        seen.append(size)
        rows = x[start + jnp.arange(size)]
        return {"sum": rows.sum(0), "outer": rows.T @ rows, "count": jnp.asarray(size)}

    out = sum_over_row_blocks(block, num_rows, block_rows)
    np.testing.assert_allclose(out["sum"], x.sum(0), rtol=1e-12)
    np.testing.assert_allclose(out["outer"], x.T @ x, rtol=1e-12)
    assert int(out["count"]) == num_rows
    assert max(seen) <= block_rows  # never more than one block's rows at once


@pytest.mark.parametrize("num_rows, block_rows, expected", [
    (10**6, 65_536, 62_500),  # a divisor in [block_rows/2, block_rows]: one block shape
    (10**5, 16_384, 12_500),
    (2**20, 65_536, 65_536),
    (1_234_567, 65_536, 65_536),  # 127 × 9721: no divisor in range, a remainder block
    (5_000, 16_384, 5_000),  # fewer rows than a block
])
def test_a_block_size_that_divides_the_rows_is_chosen_where_one_is_near(num_rows, block_rows, expected):
    size = block_size(num_rows, block_rows)
    assert size == expected
    if num_rows % size == 0:
        assert block_rows // 2 <= size <= block_rows or size == num_rows


def test_a_pass_with_a_divisor_block_traces_one_shape():
    x = jnp.arange(24.0)
    seen = []

    def block(start, size):
        seen.append(size)
        return x[start + jnp.arange(size)].sum()

    assert float(sum_over_row_blocks(block, 24, 16)) == float(x.sum())
    assert set(seen) == {12}  # 24 = 2 × 12, not 16 + 8
