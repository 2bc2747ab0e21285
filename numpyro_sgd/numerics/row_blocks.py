"""One blocked pass over the rows of the data: the sum over consecutive blocks of rows of what a
block gives, with the memory of one block. The control variates' centre, ``check_run``'s
full-data gradient and EWSGVR's calibration moments are all such passes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["FULL_PASS_ROWS", "block_size", "sum_over_row_blocks"]

#: rows per block of a full-data pass: the block's per-row gradients are FULL_PASS_ROWS × D floats
#: (1.6 MiB at D = 50 in float32), small enough for any device, large enough that a pass is a few
#: hundred calls at N = 10⁷
FULL_PASS_ROWS = 16_384


def block_size(num_rows, block_rows):
    """Rows per block of a pass over ``num_rows`` rows: the largest divisor of ``num_rows`` in
    [``block_rows``/2, ``block_rows``] where there is one, else ``block_rows`` (at most
    ``num_rows``). With a divisor the pass has one block shape, so the model is traced and its
    block compiled once, not again for the rows left after the last whole block (at N = 10⁶ in
    blocks of 65,536 rows that second shape cost about 0.9 s of tracing and 2 s of compiling)."""
    num_rows, block_rows = int(num_rows), int(block_rows)
    if num_rows <= block_rows:
        return max(1, num_rows)
    for size in range(block_rows, (block_rows + 1) // 2 - 1, -1):
        if num_rows % size == 0:
            return size
    return block_rows


def sum_over_row_blocks(block, num_rows, block_rows=FULL_PASS_ROWS):
    """Σ_b ``block(start_b, size_b)`` over consecutive blocks covering rows 0 … ``num_rows`` − 1:
    ``lax.map`` over the blocks of :func:`block_size` rows (one compiled body), then one call for
    the remaining rows, if any. ``block`` returns a pytree of arrays; ``start`` is a traced int32,
    ``size`` a Python int."""
    size = block_size(num_rows, block_rows)
    num_full, rest = divmod(int(num_rows), size)
    parts = lax.map(lambda b: block(b * size, size), jnp.arange(num_full, dtype=jnp.int32))
    total = jax.tree.map(lambda x: jnp.sum(x, axis=0), parts)
    if rest:
        total = jax.tree.map(jnp.add, total, block(jnp.asarray(num_full * size, jnp.int32), rest))
    return total
