"""The one blocked pass over the rows (``numpyro_sgd.numerics.row_blocks``) sums every row once,
whatever the number of rows and the block size."""

import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_sgd.numerics.row_blocks import sum_over_row_blocks


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
