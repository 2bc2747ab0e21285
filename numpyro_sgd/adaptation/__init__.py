"""Warmup and what it sets: the noise warmup, the coordinates of the default steps, the
control variates' centre, and the prediction of the chain's relaxation.
"""
