"""Reading runs: ArviZ export, ``check_run``, comparison with a reference, plots and
subsampled PSIS-LOO.
"""
